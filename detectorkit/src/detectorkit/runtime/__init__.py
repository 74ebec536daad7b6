"""The job runtime: the streaming job with its hand-overs and commits, the per-task processing,
record parsing, and the SparkSession."""
