"""Node logging as an operator sets it: KRAFT_LOG_LEVEL in any case for controllers and brokers,
a clear refusal for an unknown level, and ``log.file`` written by the node itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ENV, REPO, LocalCluster, poll


@pytest.fixture(scope="module")
def debug_cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("logging") / "cluster")
    subprocess.run(
        [sys.executable, "-m", "tools.cli", "cluster", "up", "--dir", str(c.dir)]
        + ["--controllers", "1", "--brokers", "1", "--detach"],
        cwd=REPO,
        env={**ENV, "KRAFT_LOG_LEVEL": "debug"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    try:
        yield c
    finally:
        c.down()


def test_lower_case_level_reaches_controllers_and_brokers(debug_cluster: LocalCluster) -> None:
    for node in ("controller-1", "broker-101"):
        log = debug_cluster.dir / node / "node.log"
        poll(lambda log=log: " DEBUG " in log.read_text(), 60, what=f"{node} logging at DEBUG")


def test_unknown_level_is_refused_with_its_name(debug_cluster: LocalCluster) -> None:
    config = debug_cluster.dir / "controller-1" / "controller.properties"
    proc = subprocess.run(
        [sys.executable, "-m", "tools.cli", "controller", "--config", str(config)],
        cwd=REPO,
        env={**ENV, "KRAFT_LOG_LEVEL": "loud"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "KRAFT_LOG_LEVEL='loud'" in proc.stderr and "Traceback" not in proc.stderr


def test_log_file_is_written_by_the_node(debug_cluster: LocalCluster) -> None:
    props = debug_cluster.dir / "broker-101" / "broker.properties"
    own = debug_cluster.dir / "broker-101" / "own.log"
    props.write_text(props.read_text() + f"log.file={own}\nlog.file.max.bytes=1000000\n")
    pid = debug_cluster.meta["brokers"][0]["pid"]
    debug_cluster.kill(101, "TERM")
    poll(lambda: not Path(f"/proc/{pid}").exists(), 60, what="broker 101 to stop")
    debug_cluster.start(101)
    poll(lambda: own.exists() and "broker 101" in own.read_text(), 60, what="broker's own log")
