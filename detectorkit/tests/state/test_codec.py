"""A key's state as a changelog value: what the store keeps of each one."""

import tracemalloc

from detectorkit.state import codec
from detectorkit.state.declaration import State


def test_an_encoded_value_takes_about_its_own_size_in_memory():
    # The store keeps every key's encoded value. orjson >= 3.12 hands back its whole output buffer
    # (4 KiB for a value of 60 bytes, home-assistant/core#181240): kept, 100,000 keys held 400 MiB
    # and each encode cost a page fault's worth of time.
    states = [{"recent_ms": [1_700_000_000_000 + i, 1_700_000_001_000 + i], "flagged_ms": None} for i in range(5_000)]
    tracemalloc.start()
    try:
        values = codec.encode_many(states, range(5_000), [None] * 5_000)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert codec.state_of(values[7]) == states[7]
    longest = max(map(len, values))
    assert held / len(values) < 2 * longest + 64, f"{held / len(values):.0f} bytes held per value of at most {longest}"


def test_a_value_carries_the_input_offset_it_reflects():
    value = codec.encode({"count": 3, "note": "a,b"}, 1_000, 2_000, tag=12_345)
    assert codec.carries_tag(value) and codec.tag_of(None, value) == 12_345
    assert codec.decode(value, State(columns=("count", "note")), "here") == ({"count": 3, "note": "a,b"}, 1_000, 2_000)
    # Written before values carried it (and still for a tombstone): the header says it.
    old = codec.encode({"count": 3}, 1_000)
    assert not codec.carries_tag(old) and codec.tag_of(None, old) is None
    assert codec.tag_of([(codec.INPUT_OFFSET_HEADER, b"77")], old) == 77
    assert codec.tag_of([(codec.INPUT_OFFSET_HEADER, b"77")], None) == 77
