"""A quiet SparkSession for the audit, with the ``kraft-metadata`` source registered.

Spark's own output (JVM start-up warnings, log4j) goes to a log file instead of the
terminal: the JVM inherits our stdout and stderr when it starts, so both point at the file
while the session is created. (Holding none of our output, the JVM does not keep a pipe reading
our output open after we exit: it stops on its own, ~1 s, once we are gone.) The driver JVM
maps its classes from the archive of :mod:`tools.audit.classdata` when there is one. Python
workers use this interpreter (``PYSPARK_PYTHON``) so they import the same ``kraft`` and
``tools`` packages.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CONF_DIR = Path(__file__).resolve().parent / "conf"
REPO = Path(__file__).resolve().parents[2]
#: Arrow Java's per-access bounds and null checks, off where the data source's batches become
#: Spark rows (every cell of every row reads an Arrow vector): ~10% of the JVM's CPU in the read.
#: The batches come from pyarrow with the schema checked by PySpark, so an out-of-range access
#: would be a bug in Spark's own conversion. On a cluster, pass the same flags to the executors
#: (``spark.executor.extraJavaOptions``, see the README).
ARROW_READ_OPTS = (
    " -Darrow.enable_unsafe_memory_access=true -Darrow.enable_null_check_for_get=false"
)
#: The throughput collector instead of G1 (the JVM's default here): no concurrent marking or
#: write barriers to pay for, and an audit's garbage is short-lived rows (docs/performance.md).
THROUGHPUT_GC = " -XX:+UseParallelGC"
#: C2 compiles only methods ~3-6x hotter than by default: Spark's warm-but-not-hot code (planning,
#: codegen, scheduling) stays at C1. And C2 inlines less (9 levels instead of 15; callees
#: compiled above 1000 bytes not inlined again): cheaper compiles of the generated stages
#: (figures in docs/performance.md).
C2_HOT_ONLY = (
    " -XX:Tier4InvocationThreshold=30000 -XX:Tier4MinInvocationThreshold=6000"
    " -XX:Tier4CompileThreshold=45000 -XX:Tier4BackEdgeThreshold=200000"
    " -XX:MaxInlineLevel=9 -XX:InlineSmallCode=1000"
)


@contextmanager
def _output_to(path: Path | None) -> Iterator[None]:
    """File descriptors 1 and 2 point at ``path`` (appended to) inside the block."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for target, kept in zip((1, 2), saved):
            os.dup2(kept, target)
            os.close(kept)
        os.close(fd)


def local_cores(master: str | None) -> int | None:
    """Cores of a ``local[N]`` / ``local[*]`` / ``local`` master (None for a cluster): the
    audit's shuffles then use that many partitions instead of Spark's 200."""
    if not master or not master.startswith("local"):
        return None
    inside = master[master.find("[") + 1 : master.find("]")] if "[" in master else "1"
    inside = inside.split(",")[0]
    return os.cpu_count() or 2 if inside == "*" else max(int(inside), 1)


def build_session(
    master: str | None = "local[*]",
    spark_log: Path | None = None,
    app_name: str = "kraft-audit",
    short: bool = True,
    source: bool = True,
) -> SparkSession:
    """Get or create the SparkSession (``master`` None: whatever spark-submit configured) and
    register the data source. ``spark_log``: where Spark's start-up output goes. ``short``:
    only small jobs are coming (a re-audit, tests), so in local mode the JVM compiles with C1
    only; the whole-log audit's window sort over millions of rows wants C2. ``source``:
    register ``kraft-metadata`` (the audit reads its Parquet mirror and leaves it out: Spark
    then asks a Python worker for the Python data sources installed, ~1 s of the start)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from tools.audit import classdata
    from tools.audit.datasource import KraftMetadataDataSource

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    # (the log4j file is named, not found through SPARK_CONF_DIR: a directory on the driver's
    # class path would rule out the class archive)
    java_opts = f"-Dlog4j2.configurationFile={CONF_DIR / 'log4j2.properties'}"
    java_opts += classdata.java_options()
    if local_cores(master):  # local mode: the driver is the executor; Spark's 1g is too small
        java_opts += ARROW_READ_OPTS + THROUGHPUT_GC
        builder = (
            builder.config("spark.driver.memory", os.environ.get("KRAFT_AUDIT_DRIVER_MEMORY", "3g"))
            # few cores: adaptive re-planning costs more CPU than it saves
            .config("spark.sql.adaptive.enabled", "false")
        )
        if short:  # C2 compiles cost more CPU than they save on small jobs; on the 2M-record
            # partition history C2 does it in 49 CPU s where C1 needs 73
            # (C1 only, the JVM reserves 48 MB for compiled code instead of 240 MB: a JVM that
            # runs many sessions, like the tests', ran out of it)
            java_opts += " -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
        else:  # C2 only for the really hot code (the generated stages' loops)
            java_opts += C2_HOT_ONLY
    java_opts += " " + os.environ.get("KRAFT_AUDIT_JAVA_OPTS", "")  # tuning: last one wins
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.sql.shuffle.partitions", str(local_cores(master) or 200))
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.executorEnv.PYTHONPATH", pythonpath)
    )
    for kv in os.environ.get("KRAFT_AUDIT_SPARK_CONF", "").split():  # tuning: KEY=VALUE ...
        builder = builder.config(*kv.split("=", 1))
    with _output_to(spark_log):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if source:
        spark.dataSource.register(KraftMetadataDataSource)
    return spark
