"""The diamond's roles besides the detectors, each a stage the runtime runs: the upstream
normaliser (and, to come, the downstream notifier)."""
