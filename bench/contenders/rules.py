"""Window rules the stateful benchmark runs with `detectorkit run --detector rules:NAME` beside their
Kafka Streams peers: rules that emit when windows close, and the burst rule keyed through a
repartition topic of its own (what re-keying by a field costs)."""

from detectorkit import windows

# A session's gap that no two records 5 ms apart can be exactly: Kafka Streams merges records a gap
# apart into one session, a rule here starts another (a gap or more ends one).
GAP_MS = 60_002
SIZE_MS = 60_000
GRACE_MS = 5_000

SESSIONS = windows.detector("sessions", windows.Session(GAP_MS / 1000, grace_seconds=GRACE_MS / 1000), windows.Count(), windows.Final())
TUMBLING = windows.detector("tumbling", windows.Tumbling(SIZE_MS / 1000, grace_seconds=GRACE_MS / 1000), windows.Count(), windows.Final())
# The template's burst rule (its defaults), keyed by the record's customer field through the job's
# repartition topic: the input is keyed by customer too, so its answers are the burst's.
BURST_REPARTITIONED = windows.detector(
    "burst-repartitioned", windows.Sliding(60, grace_seconds=5), windows.Count(), windows.AtLeast(5), key_field="customer", repartition=True
)
