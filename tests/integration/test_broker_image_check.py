"""Broker image checks on real processes: a broker's metadata image is corrupted in memory
(``testsupport.image_corrupter``: a test-only launcher of the real broker; the broker's own code
has no such hook), and its checksum no longer matches the controller's.

* A transient fault (corrupted once): the broker logs an ERROR with both checksums, reloads its
  metadata from the controller and agrees again; the controller logged an ERROR naming it.
* A fault a reload cannot repair (every published image corrupted): the broker asks to be
  fenced; the controller's ``kraft_controller_divergent_brokers`` metric and ``kraft cluster
  describe`` name it; a restart of the broker clears it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest
from harness import ENV, LocalCluster, kraft, poll

from broker.state import describe
from kraft.config import load_properties, write_properties

pytestmark = pytest.mark.integration

BROKER = 101


def metrics(host: str, port: int) -> str:
    with urlopen(f"http://{host}:{port}/metrics", timeout=5) as r:
        text: str = r.read().decode()
        return text


def broker_state(b: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return describe(b["host"], b["admin_port"], timeout=2.0)
    except (OSError, ValueError):
        return None


def create_topic(cluster: LocalCluster, name: str) -> None:
    resp = cluster.call(
        "CreateTopics", {"topics": [{"name": name, "num_partitions": 1, "replication_factor": 1}]}
    )
    assert resp["topics"][0]["error_code"] == 0, resp


def describe_cluster(cluster: LocalCluster) -> dict[str, Any]:
    """DescribeCluster as the active controller answers it (it alone knows the divergence)."""
    return cluster.call("DescribeCluster", {"active_only": True})


def test_a_broker_image_that_differs_is_reloaded_then_fenced(cluster: LocalCluster) -> None:
    cluster.up(1, 1, "--no-auth", "--metrics")
    d = str(cluster.dir)
    b = cluster.meta["brokers"][0]
    c = cluster.controller(1)
    controller_log = Path(c["log_file"])
    cluster.kill(BROKER, "TERM")
    poll(lambda: broker_state(b) is None, 30, what="broker stopped")
    props = load_properties(b["config"])
    props["metadata.image.check.interval.ms"] = "200"
    write_properties(b["config"], props)

    trigger = cluster.dir / "corrupt-image"
    broker_log = cluster.dir / "corrupted-broker.log"
    with open(broker_log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "testsupport.image_corrupter", "--trigger", str(trigger)]
            + [b["config"]],
            cwd=cluster.dir,
            env=ENV,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        poll(lambda: (broker_state(b) or {}).get("state") == "RUNNING", 60, what="broker running")

        # 1. corrupted once: reloaded, agrees again
        trigger.write_text("once")
        create_topic(cluster, "t1")
        poll(lambda: not trigger.exists(), 30, what="the image corrupted")

        def text() -> str:
            return broker_log.read_text(errors="replace")

        poll(lambda: "agrees with controller 1's" in text(), 30, what="the image repaired")
        assert f"broker {BROKER}: metadata image differs from controller 1's" in text()
        assert "discarding it and reloading the metadata from the controllers" in text()
        poll(
            lambda: (
                f"broker {BROKER}'s metadata image differs"
                in controller_log.read_text(errors="replace")
            ),
            30,
            what="the controller's ERROR",
        )

        def same_checksum() -> bool:
            node = cluster.call("DescribeNode", {}, node_id=1)
            state = broker_state(b) or {}
            return (
                state.get("last_applied_offset") == node["applied_offset"]
                and state.get("image_checksum") == node["image_checksum"]
            )

        poll(same_checksum, 30, what="the broker's checksum equal to the controller's")
        bm = metrics(b["host"], b["metrics_port"])
        assert "pykraft_broker_metadata_image_mismatch_count 1.0" in bm
        assert "pykraft_broker_metadata_image_divergent 0.0" in bm
        assert describe_cluster(cluster)["divergent_brokers"] == []

        # 2. corrupted on every publish: a reload does not help, the broker asks to be fenced
        trigger.write_text("always")
        create_topic(cluster, "t2")

        def fenced_and_named() -> dict[str, Any] | None:
            doc = describe_cluster(cluster)
            (row,) = doc["brokers"]
            ok = doc["divergent_brokers"] == [BROKER] and row["state"] == "fenced"
            return row if ok and (row["image_mismatch"] or {}).get("fenced") else None

        row = poll(fenced_and_named, 60, interval=0.3, what="the broker fenced and named")
        assert row["image_mismatch"]["controller_id"] == 1
        assert row["image_mismatch"]["checksum"] != row["image_mismatch"]["controller_checksum"]
        assert "kraft_controller_divergent_brokers 1.0" in metrics(c["host"], c["metrics_port"])
        assert "pykraft_broker_metadata_image_divergent 2.0" in metrics(
            b["host"], b["metrics_port"]
        )
        table = kraft("cluster", "describe", "--cluster", d).stdout
        assert f"Broker {BROKER}: metadata image differs" in table
        assert "still differs from controller 1's after a reload" in text()
        assert "asking to be fenced" in text()
        assert "it asks to be fenced" in controller_log.read_text(errors="replace")

        # 3. the remedy: a restart (no hook now) loads the image again and is unfenced
        trigger.unlink()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        cluster.start(BROKER)

        def clean() -> bool:
            doc = describe_cluster(cluster)
            return doc["divergent_brokers"] == [] and doc["brokers"][0]["state"] == "unfenced"

        poll(clean, 60, interval=0.3, what="the restarted broker clean and unfenced")
        assert "kraft_controller_divergent_brokers 0.0" in metrics(c["host"], c["metrics_port"])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
