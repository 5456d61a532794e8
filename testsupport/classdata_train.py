"""``python -m testsupport.classdata_train WORK``: the run whose JVM writes the audit's class
archive (started by :func:`tools.audit.classdata.create` with ``-XX:ArchiveClassesAtExit``).

Kept apart from :mod:`tools.audit.classdata` because it runs a whole audit: the session
builder reads ``classdata`` for its JVM options, and ``classdata`` must not import the audit.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark import SparkContext

from testsupport.sample_log import write_history
from tools.audit.classdata import CREATE_TIMEOUT_S
from tools.audit.run import AuditOptions, run_audit
from tools.audit.session import build_session


def train(work: Path, timeout: float = CREATE_TIMEOUT_S) -> None:
    """Run a small whole audit and a re-audit in a JVM that archives its classes at exit, then
    stop that JVM and wait until it has written the archive."""
    log_dir, out = work / "log", work / "out"
    write_history(log_dir, segment_bytes=4096)  # several segments: the mirror's paths too
    spark = build_session("local[2]", work / "spark.log")
    gateway = SparkContext._gateway
    for _ in range(2):  # the second run carries on from the first (the re-audit's classes)
        run_audit(AuditOptions(log_dir, out, master="local[2]"), spark, progress=lambda _: None)
    spark.stop()
    assert gateway is not None  # build_session started it
    jvm = gateway.proc  # the JVM exits (and dumps) when its stdin closes
    jvm.stdin.close()
    jvm.wait(timeout)


if __name__ == "__main__":
    train(Path(sys.argv[1]))
