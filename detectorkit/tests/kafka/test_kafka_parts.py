"""The Kafka parts on a real broker, without Spark: end offsets, the reader, the offset store, the sink."""

import time
import uuid

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from detectorkit.kafka import clients
from detectorkit.kafka.end_offsets import EndOffsetProbe
from detectorkit.kafka.offset_store import OffsetStore
from detectorkit.kafka.planning import DataLossError, PartitionRange
from detectorkit.kafka.range_reader import read_ranges
from detectorkit.kafka.sink import DeliveryError, Sink
from detectorkit.testing import wait_for


@pytest.fixture
def base(kafka_bootstrap_servers):
    return clients.base(kafka_bootstrap_servers)


@pytest.fixture
def topic(base):
    name = f"parts.{uuid.uuid4().hex[:8]}"
    clients.create_topics(base, {name: 2})
    return name


def produce(base, topic, count, partition=0, linger_ms=50):
    # One big producer batch: the case where ListOffsets(latest) is wrong on Tansu.
    producer = Producer(clients.producer(base, **{"linger.ms": linger_ms}))
    for i in range(count):
        producer.produce(topic, key=str(i).encode(), value=f'{{"n": {i}}}'.encode(), partition=partition)
    assert producer.flush(30) == 0


def poll_until(fn, expected, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value == expected or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def test_probe_reports_the_exact_end_even_within_one_producer_batch(base, topic):
    produce(base, topic, 1000)
    probe = EndOffsetProbe(clients.consumer(base, "probe"), topic)
    assert poll_until(lambda: probe.end_offsets([0, 1]), {0: 1000, 1: 0}) == {0: 1000, 1: 0}
    produce(base, topic, 7, partition=1)
    assert poll_until(lambda: probe.end_offsets([0, 1]), {0: 1000, 1: 7}) == {0: 1000, 1: 7}
    probe.close()


def test_probe_never_reports_beyond_the_end(base, topic):
    probe = EndOffsetProbe(clients.consumer(base, "probe"), topic)
    for round_ in range(5):
        produce(base, topic, 200, linger_ms=5)
        ends = probe.end_offsets([0])
        assert ends[0] <= 200 * (round_ + 1)
    assert poll_until(lambda: probe.end_offsets([0]), {0: 1000}) == {0: 1000}
    probe.close()


def reader(base):
    return Consumer(clients.consumer(base, "reader", **{"enable.partition.eof": True, "auto.offset.reset": "error"}))


def test_read_range_returns_exactly_the_planned_records(base, topic):
    produce(base, topic, 500)
    consumer = reader(base)
    batches = list(read_ranges(consumer, [PartitionRange(topic, 0, 120, 377)], True, 10))
    table = pa.Table.from_batches(batches)
    assert table.column("offset").to_pylist() == list(range(120, 377))
    assert table.column("key").to_pylist()[0] == b"120"
    assert set(table.column("partition").to_pylist()) == {0}
    assert table.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    # The same worker consumer serves the next task.
    again = pa.Table.from_batches(list(read_ranges(consumer, [PartitionRange(topic, 0, 0, 3)], True, 10)))
    assert again.column("offset").to_pylist() == [0, 1, 2]
    consumer.close()


def test_read_range_chunks_large_ranges(base, topic, monkeypatch):
    import detectorkit.kafka.range_reader as range_reader

    monkeypatch.setattr(range_reader, "CHUNK_RECORDS", 100)
    produce(base, topic, 450)
    consumer = reader(base)
    batches = list(read_ranges(consumer, [PartitionRange(topic, 0, 0, 450)], True, 10))
    assert [b.num_rows for b in batches] == [100, 100, 100, 100, 50]
    consumer.close()


def test_range_beyond_the_end_of_a_partition_is_data_loss(base, topic):
    produce(base, topic, 10)
    consumer = reader(base)
    with pytest.raises(DataLossError, match=r"ends at offset 10, before the planned 20.*FAIL_ON_DATA_LOSS=false"):
        list(read_ranges(consumer, [PartitionRange(topic, 0, 0, 20)], True, 10))
    consumer.close()


def test_skipping_data_loss_returns_what_is_there(base, topic):
    produce(base, topic, 10)
    consumer = reader(base)
    table = pa.Table.from_batches(list(read_ranges(consumer, [PartitionRange(topic, 0, 5, 20)], False, 10)))
    assert table.column("offset").to_pylist() == [5, 6, 7, 8, 9]
    consumer.close()


def test_deleted_topic_is_data_loss(base, topic):
    produce(base, topic, 10)
    admin = AdminClient(base)  # kept alive until the deletion is confirmed
    admin.delete_topics([topic])[topic].result()
    consumer = reader(base)
    with pytest.raises(DataLossError, match=topic):
        list(read_ranges(consumer, [PartitionRange(topic, 0, 0, 10)], True, 10))
    consumer.close()


def test_offset_store_round_trip(base, topic):
    store = OffsetStore(clients.consumer(base, f"g-{uuid.uuid4().hex[:6]}"), topic)
    assert store.committed([0, 1]) == {0: None, 1: None}
    store.commit({0: 42})
    store.commit({1: 7, 0: 43})
    assert store.committed([0, 1]) == {0: 43, 1: 7}
    store.close()


def test_the_broker_kind_is_detected(base, kafka_broker_kind):
    from detectorkit.devtools.embedded_broker import EmbeddedBroker
    from detectorkit.kafka import broker_kind
    from detectorkit.testing import KAFKA, TANSU

    if kafka_broker_kind in (KAFKA, TANSU):
        assert broker_kind.detect(base, 10) == (broker_kind.KAFKA if kafka_broker_kind == KAFKA else broker_kind.TANSU)
    with EmbeddedBroker() as tansu:
        assert broker_kind.detect(clients.base(tansu.bootstrap_servers), 10) == broker_kind.TANSU


def test_list_offsets_ends_are_exact_on_kafka(base, topic, kafka_broker_kind):
    from detectorkit.kafka.end_offsets import ListOffsetsEnds
    from detectorkit.testing import TANSU

    if kafka_broker_kind == TANSU:
        pytest.skip("ListOffsets(latest) is wrong on Tansu: that is why the probe exists")
    produce(base, topic, 1000)
    produce(base, topic, 7, partition=1)
    ends = ListOffsetsEnds(base, topic, 10)
    assert ends.end_offsets([0, 1]) == {0: 1000, 1: 7}
    assert ends.earliest([0, 1]) == {0: 0, 1: 0}
    assert ends.topic_partitions() == [0, 1]


def test_a_batch_sent_past_a_full_local_queue_arrives_whole(base, topic):
    # produce_batch queues what fits and marks the rest: those are sent again once deliveries drain.
    sink = Sink(clients.producer(base, **{"queue.buffering.max.messages": 500}))
    records = [(f"k{i}", f'{{"n": {i}}}'.encode()) for i in range(3_000)]
    sink.send_batch(topic, 1, records)
    sink.flush(30)
    consumer = reader(base)
    consumer.assign([TopicPartition(topic, 1, 0)])
    got = {}
    deadline = time.monotonic() + 30
    while len(got) < len(records) and time.monotonic() < deadline:
        for message in consumer.consume(1_000, timeout=0.5):
            if message.error() is None:
                got[message.key().decode()] = message.value()
    consumer.close()
    assert got == dict(records)


def test_a_batch_to_a_partition_that_does_not_exist_fails(base, topic):
    # Refused at once when the producer knows the topic, or reported by the flush when it learns it.
    sink = Sink(clients.producer(base))
    with pytest.raises((KafkaException, DeliveryError), match="Unknown partition"):
        sink.send_batch(topic, 7, [("k", b"v")])
        sink.flush(30)


def test_a_slices_reader_past_a_partitions_end_skips_back_to_its_start(base, topic, kafka_broker_kind):
    # The input topic was deleted and re-created with fewer records while a slice read it: the new
    # partition is read from its start.
    from detectorkit.kafka.position_reader import PositionReader
    from detectorkit.kafka.range_reader import reader_conf
    from detectorkit.testing import TANSU

    if kafka_broker_kind == TANSU:
        pytest.skip("Tansu answers a fetch past the end with no records, not an out-of-range error")
    produce(base, topic, 5)
    consumer = Consumer(reader_conf(base, f"parts-{uuid.uuid4().hex[:8]}", "kafka"))
    reader = PositionReader(consumer, topic, {0: 50}, fail_on_data_loss=False, timeout=10)
    read = []
    deadline = time.monotonic() + 30
    while len(read) < 5 and time.monotonic() < deadline:
        batch = reader.poll(0.2)
        read += batch.column("offset").to_pylist() if batch is not None else []
    reader.close()
    consumer.close()
    assert read == [0, 1, 2, 3, 4] and reader.position[0] == 5 and reader.went_back == {0}


def test_a_topic_created_again_has_a_new_id_and_none_while_it_is_gone(base, topic):
    # What tells a slice's driver that the partitions it reads from its positions are new ones.
    admin = clients.new_admin(base)
    first = clients.topic_id(admin, topic, 10)
    assert first and clients.topic_id(admin, topic, 10) == first
    admin.delete_topics([topic])[topic].result()
    wait_for(lambda: clients.topic_id(admin, topic, 10) is None, timeout=30, what="the deleted topic to be gone")
    clients.create_topics(base, {topic: 2})
    again = clients.topic_id(admin, topic, 10)
    assert again and again != first
