"""A SparkSession tuned for small streaming jobs, with the Kafka source registered."""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import SparkSession

from detectorkit.runtime import jvm, shipping

CHECKPOINT_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def session(master: str | None = "local[2]", app_name: str = "detectorkit", ship: Iterable[str] = ()) -> SparkSession:
    """A session on `master`. On a cluster (any master but local), the packages named in `ship`
    are zipped and sent to the executors (see shipping), whose Python is PYSPARK_PYTHON (their
    environment's, with detectorkit's dependencies) and whose log4j2.properties is the workers'
    own (SPARK_CONF_DIR): a file path of this machine means nothing there. `master` None: the one
    spark-submit was given; its JVM runs already, so the PYTHONPATH set for the planner comes too
    late there, and the driver's Python (spark.pyspark.python) must have detectorkit installed."""
    local = master is not None and master.startswith("local")
    submitted = master is None
    zips = [] if local else shipping.zip_packages(ship)
    jvm.prepare_environment(local)
    builder = SparkSession.builder if submitted else SparkSession.builder.master(master)
    builder = (
        builder.appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # A detector's JVM, not an analytics one (see jvm): a small heap, C1, the class archive.
        .config("spark.driver.extraJavaOptions", jvm.java_options())
        .config("spark.driver.memory", jvm.DRIVER_MEMORY)
        # Arrow's default pool (jemalloc) kept ~45 MiB per Python worker after a backlog that
        # the system allocator returned (peak PSS of the two workers 623 -> 530 MiB, throughput
        # unchanged); a worker's Arrow buffers are a task's records, made and dropped per batch.
        .config("spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL", "system")
    )
    if local:
        builder = builder.config("spark.executor.extraJavaOptions", jvm.log4j_option())
        # Workers import PySpark from its installed package, bytecode cached, not from its zip (see worker_daemon).
        builder = builder.config("spark.python.daemon.module", "detectorkit.runtime.worker_daemon")
    spark = (
        builder
        # No shuffle in the job; keep any that a user adds small on a laptop.
        .config("spark.sql.shuffle.partitions", "2")
        # Starting a Python worker per task doubles the latency.
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # Spark hands the workers of its SQL jobs the simplified-traceback flag and those of its
        # RDD jobs nothing; workers are shared only between jobs whose environments are equal, and
        # the job's start warms them with an RDD job (processing.warm_workers). The tracebacks of
        # a failed task are then whole, which costs nothing: a detector's errors are dead letters.
        .config("spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled", "false")
        # Streaming queries cannot use adaptive execution; saying so spares a warning per query.
        .config("spark.sql.adaptive.enabled", "false")
        # An empty micro-batch per idle trigger would only cost time.
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        # The default manager renames each checkpoint file through Hadoop's FileContext, whose
        # local file system forks `readlink` several times per rename (jstack: Shell.execCommand
        # under FileUtil.readLink): 55 + 120 ms of every micro-batch's walCommit and commitOffsets,
        # measured at 1,000 records/s; this one renames directly (20 + 25 ms). What its rename does
        # not promise (atomicity on some stores) costs nothing here: the job never reads a
        # checkpoint back, the group's offsets are its position.
        .config("spark.sql.streaming.checkpointFileManagerClass", CHECKPOINT_FILE_MANAGER)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    shipping.ship(spark, zips)
    return spark
