"""A rolling upgrade: one of three controllers runs a changed placement rule (the test-only
``KRAFT_TEST_PLACEMENT`` hook in kraft/controller/placement.py). Only the active controller runs
handlers and the others append its batches verbatim, so after creates, broker fencings and config
changes every metadata log is byte-identical and every image checksum matches, whichever
controller placed the replicas."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.harness import ENV, REPO, LocalCluster, kraft, log_stream_digest, poll

pytestmark = pytest.mark.integration

UPGRADED = 3  # the controller running the changed placement rule


def _start_upgraded(cluster: LocalCluster) -> None:
    cluster.kill(UPGRADED, "TERM")
    env = dict(ENV, KRAFT_TEST_PLACEMENT="followers-reversed")
    kraft("cluster", "start", "--dir", str(cluster.dir), "--node", str(UPGRADED), env=env)


def _sim_brokers(cluster: LocalCluster, first_id: int, count: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "testsupport.sim_broker", "--cluster", str(cluster.dir)]
        + ["--count", str(count), "--first-id", str(first_id)],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    line = poll(lambda: proc.stdout.readline(), 60, what="simulated brokers ready")
    assert line.strip() == "ready", line
    return proc


def _leader(cluster: LocalCluster) -> int:
    return poll(lambda: cluster.active_controller(), 30, what="an active controller")


def _create(cluster: LocalCluster, name: str) -> None:
    reply = cluster.call(
        "CreateTopics",
        {"topics": [{"name": name, "num_partitions": 4, "replication_factor": 3}]},
    )
    assert reply["topics"][0]["error_code"] == 0, reply


def _alter(cluster: LocalCluster, name: str, value: str) -> None:
    reply = cluster.call(
        "IncrementalAlterConfigs",
        {
            "resources": [
                {
                    "resource_type": "topic",
                    "resource_name": name,
                    "ops": [{"name": "retention.ms", "op": "SET", "value": value}],
                }
            ]
        },
    )
    assert reply["resources"][0]["error_code"] == 0, reply


def _fenced(cluster: LocalCluster, ids: set[int]) -> bool:
    brokers = cluster.call("DescribeCluster", {})["brokers"]
    return ids <= {b["broker_id"] for b in brokers if b["fenced"]}


def test_controllers_with_different_placement_write_identical_logs(cluster):
    cluster.up(controllers=3)
    _start_upgraded(cluster)
    cluster.start_sim_brokers(4)  # brokers 101..104
    doomed = _sim_brokers(cluster, 201, 2)  # killed below: fenced by session timeout
    try:
        for round_ in range(3):
            # the upgraded controller leads one round: its placement is then the one written
            if round_ == 1 and _leader(cluster) != UPGRADED:
                for other in (1, 2):
                    if _leader(cluster) == UPGRADED:
                        break
                    cluster.kill(_leader(cluster), "TERM")
                    cluster.start()
            for i in range(4):
                _create(cluster, f"t{round_}-{i}")
                _alter(cluster, f"t{round_}-{i}", str(60_000 + i))
            if round_ == 0:
                os.killpg(doomed.pid, signal.SIGKILL)
                doomed.wait(10)
                poll(lambda: _fenced(cluster, {201, 202}), 60, what="brokers 201, 202 fenced")
    finally:
        if doomed.poll() is None:
            os.killpg(doomed.pid, signal.SIGKILL)
            doomed.wait(10)
    ids = [c["id"] for c in cluster.meta["controllers"]]

    seen: dict[int, tuple] = {}

    def converged():
        for i in ids:
            n = cluster.call("DescribeNode", {"checksum": True}, node_id=i)
            seen[i] = (n["log_end_offset"], n["image_checksum"])
        return len(set(seen.values())) == 1

    try:
        poll(converged, 60, what="every controller at the same offset with the same checksum")
    finally:
        cluster.down()
        digests = {i: log_stream_digest(cluster.log_dir(i)) for i in ids}
        print("controllers (log end, image checksum):", seen)
        print("metadata logs (next offset, sha256 of every batch):", digests)
    assert len(set(digests.values())) == 1, digests
