"""Metrics and aggregation: the job's registry, its reporter and snapshots, and the shared
metrics-aggregator."""
