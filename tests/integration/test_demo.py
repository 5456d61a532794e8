"""``make demo`` for real: ``python -m tools.demo`` in a scratch directory runs the whole story to
exit 0 and leaves no process behind; Ctrl-C while the cluster is starting stops every node too."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from harness import ENV, poll

pytestmark = pytest.mark.integration
DEMO_TIMEOUT_S = 840  # the whole story incl. the Spark audit step, on 2 loaded cores


def processes_under(directory: Path) -> list[psutil.Process]:
    """Live processes whose command line names a path in ``directory`` (the demo's nodes)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and str(directory) in " ".join(
                p.info["cmdline"] or ()
            ):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def kill_leftovers(directory: Path) -> None:
    """Test cleanup only: a failing demo must not leave nodes running for the rest of the suite."""
    for p in processes_under(directory):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def start_demo(cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tools.demo"],
        cwd=cwd,
        env=ENV,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.mark.timeout(DEMO_TIMEOUT_S + 60)
def test_demo_tells_the_whole_story_and_cleans_up(tmp_path: Path) -> None:
    demo = start_demo(tmp_path)
    try:
        out, _ = demo.communicate(timeout=DEMO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(demo.pid, signal.SIGKILL)
        out, _ = demo.communicate()
        kill_leftovers(tmp_path)
        pytest.fail(f"the demo did not finish in {DEMO_TIMEOUT_S}s:\n{out[-4000:]}")
    try:
        assert demo.returncode == 0, out[-4000:]
        for heading in (
            "1. Start 3 controllers + 3 brokers",
            "2. The Raft quorum and some topics",
            "3. Two consumers in one group split a topic",
            "4. Exactly once: one transaction commits, another aborts",
            "5. Crash the active controller",
            "6. Crash the broker leading orders partition 0",
            "7. Audit the metadata log with Spark",
            "8. Stop everything",
        ):
            assert f"=== {heading}" in out
        for created in ("orders", "payments", "audit-log"):
            assert f"Created topic {created} with" in out
        old, new = map(int, re.search(r"Active controller: (\d+) -> (\d+)", out).groups())
        assert old != new and {old, new} <= {1, 2, 3}
        victim = int(re.search(r"Broker (\d+) leads: ", out).group(1))
        assert f"broker {victim} fenced: done" in out and f"broker {victim} unfenced: done" in out
        assert re.search(rf"orders-0: {victim} -> (?!{victim})\d+", out)
        assert "both members assigned 3 partitions each: done" in out
        assert "app-1 owning all 6 partitions: done" in out and "LOG-END-OFFSET" in out
        assert "The read_committed consumer saw: paid-0, paid-1, paid-2" in out
        assert re.search(r"payments-writer +\d+ +\d+ +(CompleteCommit|PrepareCommit)", out), out[
            -4000:
        ]
        assert "Demo finished in" in out
        assert processes_under(tmp_path) == []
    finally:
        kill_leftovers(tmp_path)


def test_ctrl_c_while_the_cluster_starts_stops_every_node(tmp_path: Path) -> None:
    demo = start_demo(tmp_path)
    try:
        # Ctrl-C once a node runs: the terminal sends SIGINT to the whole foreground group.
        poll(
            lambda: processes_under(tmp_path / "demo-cluster"),
            120,
            interval=0.2,
            what="the demo's first node process",
        )
        os.killpg(demo.pid, signal.SIGINT)
        out, _ = demo.communicate(timeout=180)
        assert demo.returncode == 130, out[-4000:]
        assert "Interrupted." in out and "=== 8. Stop everything" in out
        assert processes_under(tmp_path) == []  # the demo ran 'cluster down' before exiting
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(10)
        kill_leftovers(tmp_path)
