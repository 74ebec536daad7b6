"""Kafka I/O and offsets: clients, the Spark source and sink, end offsets, the offset store and
the consumer-group member that owns partitions and commits."""
