"""The audit's driver JVM: its class archive (where it lives, when it is used, that a real Spark
driver maps it and starts quietly when the archive is unusable) and its options."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from tools.audit import classdata

REPO = Path(__file__).resolve().parents[2]

# A fresh driver JVM (a session in this test process may already own one, started with other
# options): build the session, ask the JVM what it mapped, run a job.
PROBE = """
import json, subprocess, sys
from pathlib import Path
from pyspark import SparkContext
from tools.audit.session import build_session
spark = build_session("local[1]", Path(sys.argv[1]))
pid = SparkContext._gateway.proc.pid
info = subprocess.run(["jcmd", str(pid), "VM.info"], capture_output=True, text=True,
                      timeout=60).stdout
mapped = [l for l in info.splitlines() if l.startswith("CDS archive(s) mapped at")]
size = int(mapped[0].split("size ")[1].split(",")[0]) if mapped else 0
jvm = spark._jvm
gcs = [b.getName() for b in jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()]
print(json.dumps({"mapped_bytes": size, "rows": spark.range(1000).count(), "gc": gcs,
                  "probe": jvm.java.lang.System.getProperty("kraft.probe")}))
spark.stop()
"""


def _probe(tmp_path: Path, **env: str) -> tuple[dict, str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "spark.log")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    return json.loads(last), proc.stdout


def test_no_archive_where_spark_conf_dir_is_a_non_empty_directory(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    conf.mkdir()
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    monkeypatch.setenv("KRAFT_AUDIT_CDS_DIR", str(tmp_path / "cds"))
    monkeypatch.delenv("KRAFT_AUDIT_CDS_DUMP", raising=False)
    empty_dir_archive = classdata.archive_path()
    assert empty_dir_archive is not None and empty_dir_archive.parent == tmp_path / "cds"
    (conf / "spark-defaults.conf").write_text("spark.foo bar\n")
    assert "non-empty directory" in (classdata.blocker() or "")
    assert classdata.archive_path() is None and classdata.java_options() == ""
    path, what = classdata.create()
    assert path is None and "non-empty directory" in what
    assert not (tmp_path / "cds").exists()


def test_archive_is_keyed_by_the_class_path_and_used_only_when_present(tmp_path, monkeypatch):
    monkeypatch.setenv("KRAFT_AUDIT_CDS_DIR", str(tmp_path))
    monkeypatch.delenv("KRAFT_AUDIT_CDS_DUMP", raising=False)
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    default = classdata.archive_path()
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "elsewhere"))
    moved = classdata.archive_path()
    assert default is not None and moved is not None and default != moved
    assert classdata.java_options() == ""  # nothing written yet
    moved.write_bytes(b"x")
    assert f"-XX:SharedArchiveFile={moved}" in classdata.java_options()
    assert "-Xlog:cds*=off" in classdata.java_options()
    monkeypatch.setenv("KRAFT_AUDIT_CDS", "off")
    assert classdata.archive_path() is None and classdata.java_options() == ""


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("jcmd") is None, reason="jcmd (the JDK's) not on PATH")
def test_a_real_driver_maps_the_archive(tmp_path):
    path, _ = classdata.create()  # written by `make`; a no-op then
    assert path is not None and path.is_file()
    got, stdout = _probe(tmp_path, KRAFT_AUDIT_JAVA_OPTS="-Dkraft.probe=yes")
    assert got["rows"] == 1000
    assert got["probe"] == "yes"  # the user's extra driver options reach the JVM
    assert "PS Scavenge" in got["gc"], got  # the throughput collector
    # the base JDK archive alone maps a few MiB; with ours on top it is the archive's size
    assert got["mapped_bytes"] > path.stat().st_size, got
    assert "[warning]" not in stdout


@pytest.mark.integration
def test_an_unusable_archive_is_ignored_quietly(tmp_path):
    """An archive the JVM rejects (here: written for another class path) costs nothing but the
    speed-up: no warning in the user's terminal."""
    made, _ = classdata.create()
    assert made is not None
    env = {
        "KRAFT_AUDIT_CDS_DIR": str(tmp_path / "cds"),
        "SPARK_CONF_DIR": str(tmp_path / "other-conf"),
    }  # first on the class path
    probe = (
        f"import os; os.environ.update({env!r}); from tools.audit import classdata; "
        "print(classdata.archive_path())"
    )
    where = Path(
        subprocess.run(
            [sys.executable, "-c", probe],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
    )
    where.parent.mkdir(parents=True)
    shutil.copyfile(made, where)
    (tmp_path / "other-conf").mkdir()
    got, stdout = _probe(tmp_path, **env)
    assert got["rows"] == 1000
    assert got["mapped_bytes"] < made.stat().st_size  # rejected: the JDK's base archive only
    assert "[warning]" not in stdout and "archive" not in stdout.lower(), stdout


def test_archives_unused_for_a_month_are_pruned_beside_a_new_one(tmp_path):
    keep = tmp_path / "spark-classes-aaaa.jsa"
    stale, recent, other = (
        tmp_path / "spark-classes-bbbb.jsa",
        tmp_path / "spark-classes-cccc.jsa",
        tmp_path / "notes.txt",
    )
    for p in (keep, stale, recent, other):
        p.write_bytes(b"x")
    month_ago = time.time() - classdata.UNUSED_FOR_S - 60
    for p in (keep, stale, other):
        os.utime(p, (month_ago, month_ago))
    assert classdata.prune(keep) == [stale]
    assert keep.exists() and recent.exists() and other.exists() and not stale.exists()
