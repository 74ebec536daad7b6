"""Backtests: what a detector would have flagged over history, with the live service's answers.

    from detectorkit import backtest

    result = backtest.run(DETECTOR, backtest.from_kafka(conf, "records.normalized", start=week_ago_ms))
    print("\\n".join(backtest.summarise(result).lines()))
    result.frame()  # the detections as a table

The records go through the stage the live job runs (parsing, dead letters, the detector, its state
and event-time timers), partition by partition in offset order, so the detections are the ones the
live service wrote for the same records. One difference is named in the summary instead of passing
silently: live, a quiet partition's timers fire by the wall clock; here, only records move time.
Nothing is written to Kafka and no offset is committed: the service's consumer group is untouched.
"""

from __future__ import annotations

from detectorkit.backtest.diff import Diff, compare
from detectorkit.backtest.history import Chunk, History, HistoryError, from_files, from_frame, from_kafka
from detectorkit.backtest.replay import Backtest, run, run_on_spark
from detectorkit.backtest.summary import Ranking, Score, Summary, at_threshold, ranking, read_labels, summarise

__all__ = [
    "Backtest",
    "Diff",
    "compare",
    "History",
    "HistoryError",
    "Ranking",
    "Score",
    "Chunk",
    "Summary",
    "at_threshold",
    "from_files",
    "from_frame",
    "from_kafka",
    "ranking",
    "read_labels",
    "run",
    "run_on_spark",
    "summarise",
]
