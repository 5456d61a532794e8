"""The controller quorum as a user meets it: real controller processes on loopback, driven by the
``kraft`` CLI and the controller RPC."""

from __future__ import annotations

import threading

import pytest
import trio

from kraft.errors import ErrorCode, KraftError
from kraft.rpc.client import ControllerClient, call_sync
from tests.harness import LocalCluster, kraft, kraft_json, log_stream_digest, poll

pytestmark = pytest.mark.integration


def _topic_names(cluster: LocalCluster, node_id: int) -> set[str]:
    listing = kraft_json(
        "topics",
        "list",
        "--bootstrap-controller",
        cluster.bootstrap(node_id),
        env=cluster.cli_env(),
    )
    return {t["name"] for t in listing["topics"]}


def test_three_controllers_elect_exactly_one_active(cluster):
    cluster.up(controllers=3)
    ids = [c["id"] for c in cluster.meta["controllers"]]

    def agreed_leader():
        views = [
            kraft_json(
                "quorum",
                "status",
                "--bootstrap-controller",
                cluster.bootstrap(i),
                env=cluster.cli_env(),
            )
            for i in ids
        ]
        leaders = {v["leader_id"] for v in views}
        return views if len(leaders) == 1 and leaders != {-1} else None

    views = poll(agreed_leader, 30, what="all controllers to agree on one leader")
    leader = views[0]["leader_id"]
    assert leader in ids
    assert [v["node_id"] for v in views[0]["voters"] if v["is_leader"]] == [leader]
    assert {v["term"] for v in views} == {views[0]["term"]}

    # brokers fetch metadata with leader_only: a follower sends them on to the leader
    follower = next(i for i in ids if i != leader)
    body = {"from_offset": 0, "max_wait_ms": 0}
    from_follower = cluster.call("FetchMetadata", body, node_id=follower)
    assert from_follower["batches"], from_follower

    async def leader_only() -> tuple[dict, tuple[str, int] | None]:
        c = cluster.controller(follower)
        client = ControllerClient(
            [(c["host"], c["rpc_port"])], client_id="t", credentials=cluster.credentials()
        )
        try:
            resp = await client.call("FetchMetadata", dict(body, leader_only=True), timeout=10)
            return resp, client.connected_to
        finally:
            await client.aclose()

    resp, answered_by = trio.run(leader_only)
    active = cluster.controller(leader)
    assert answered_by == (active["host"], active["rpc_port"])
    assert resp["batches"][0] == from_follower["batches"][0]


def test_topics_created_and_deleted_on_every_controller(cluster):
    cluster.up(controllers=3)
    cluster.start_sim_brokers(3)
    kraft(
        "topics",
        "create",
        "orders",
        "--partitions",
        "6",
        "--replication-factor",
        "3",
        "--config",
        "retention.ms=60000",
        "--cluster",
        str(cluster.dir),
    )
    kraft(
        "topics",
        "create",
        "events",
        "--partitions",
        "2",
        "--replication-factor",
        "2",
        "--cluster",
        str(cluster.dir),
    )
    ids = [c["id"] for c in cluster.meta["controllers"]]
    for i in ids:
        poll(
            lambda: {"orders", "events"} <= _topic_names(cluster, i),
            20,
            what=f"topics on controller {i}",
        )
        described = kraft_json(
            "topics",
            "describe",
            "orders",
            "--bootstrap-controller",
            cluster.bootstrap(i),
            env=cluster.cli_env(),
        )
        topic = described["topics"][0]
        assert len(topic["partitions"]) == 6
        for p in topic["partitions"]:
            assert len(set(p["replicas"])) == 3 and p["leader"] in p["isr"]
    kraft("topics", "delete", "orders", "--cluster", str(cluster.dir))
    for i in ids:
        poll(
            lambda: "orders" not in _topic_names(cluster, i),
            20,
            what=f"orders gone on controller {i}",
        )


def test_bad_input_gets_kafka_errors_and_changes_nothing(cluster):
    cluster.up(controllers=3)
    cluster.start_sim_brokers(3)
    d = str(cluster.dir)
    cases = [
        (["topics", "create", "bad name!", "--cluster", d], "INVALID_TOPIC_EXCEPTION"),
        (
            ["topics", "create", "x", "--replication-factor", "4", "--cluster", d],
            "INVALID_REPLICATION_FACTOR",
        ),
        (
            ["topics", "create", "x", "--config", "retention.ms=soon", "--cluster", d],
            "INVALID_CONFIG",
        ),
        (
            ["topics", "create", "x", "--replica-assignment", "101:999", "--cluster", d],
            "INVALID_REPLICA_ASSIGNMENT",
        ),
    ]
    before = kraft_json("topics", "list", "--cluster", d)
    for args, error in cases:
        proc = kraft(*args, check=False)
        assert proc.returncode != 0, args
        assert error in proc.stderr, (args, proc.stderr)
    # The CLI refuses --partitions 0 itself; the controller must refuse it too.
    bootstrap = [(c["host"], c["rpc_port"]) for c in cluster.meta["controllers"]]
    result = call_sync(
        bootstrap,
        "CreateTopics",
        {"topics": [{"name": "x", "num_partitions": 0, "replication_factor": 1}]},
        10,
        credentials=cluster.credentials(),
    )
    assert result["topics"][0]["error_code"] == ErrorCode.INVALID_PARTITIONS
    kraft("topics", "create", "dup", "--cluster", d)
    proc = kraft("topics", "create", "dup", "--cluster", d, check=False)
    assert proc.returncode != 0 and "TOPIC_ALREADY_EXISTS" in proc.stderr
    after = kraft_json("topics", "list", "--cluster", d)
    assert {t["name"] for t in after["topics"]} == {t["name"] for t in before["topics"]} | {"dup"}


def _create_stream(
    bootstrap, stop: threading.Event, acknowledged: list, failed: list, credentials=None
) -> None:
    async def run():
        client = ControllerClient(bootstrap, client_id="stream", credentials=credentials)
        i = 0
        try:
            while not stop.is_set():
                name = f"stream-{i}"
                i += 1
                try:
                    result = await client.call(
                        "CreateTopics",
                        {"topics": [{"name": name, "num_partitions": 1, "replication_factor": 1}]},
                        timeout=15,
                    )
                except (KraftError, trio.TooSlowError, OSError) as e:
                    failed.append((name, repr(e)))
                    continue
                if result["topics"][0]["error_code"] == 0:
                    acknowledged.append(name)
                else:
                    failed.append((name, result["topics"][0]))
        finally:
            await client.aclose()

    trio.run(run)


def test_kill_active_controller_during_creates_loses_nothing(cluster):
    cluster.up(controllers=3)
    cluster.start_sim_brokers(3)
    bootstrap = [(c["host"], c["rpc_port"]) for c in cluster.meta["controllers"]]
    acknowledged: list[str] = []
    failed: list = []
    stop = threading.Event()
    writer = threading.Thread(
        target=_create_stream,
        args=(bootstrap, stop, acknowledged, failed, cluster.credentials()),
        daemon=True,
    )
    writer.start()
    try:
        poll(lambda: len(acknowledged) >= 20, 30, what="creates before the kill")
        old_leader = cluster.active_controller()
        cluster.kill(old_leader)
        count_at_kill = len(acknowledged)
        poll(
            lambda: len(acknowledged) >= count_at_kill + 20,
            30,
            what="creates to continue after failover",
        )
        new_leader = cluster.active_controller()
        assert new_leader != old_leader
    finally:
        stop.set()
        writer.join(30)
    survivors = [c["id"] for c in cluster.meta["controllers"] if c["id"] != old_leader]
    names = _topic_names(cluster, survivors[0])
    missing = set(acknowledged) - names
    assert not missing, f"acknowledged creates lost: {sorted(missing)[:10]}"
    cluster.start(old_leader)
    poll(
        lambda: set(acknowledged) <= _topic_names(cluster, old_leader),
        60,
        what="the restarted controller to catch up",
    )
    cluster.down()
    digests = {
        c["id"]: log_stream_digest(cluster.log_dir(c["id"])) for c in cluster.meta["controllers"]
    }
    assert len(set(digests.values())) == 1, digests


def test_stop_all_and_restart_keeps_topics_and_log(cluster):
    cluster.up(controllers=3)
    cluster.start_sim_brokers(3)
    for name in ("a", "b", "c"):
        kraft(
            "topics",
            "create",
            name,
            "--partitions",
            "3",
            "--replication-factor",
            "3",
            "--cluster",
            str(cluster.dir),
        )
    before = kraft_json("topics", "describe", "--cluster", str(cluster.dir))
    cluster.down()
    digests_before = {
        c["id"]: log_stream_digest(cluster.log_dir(c["id"])) for c in cluster.meta["controllers"]
    }
    assert len(set(digests_before.values())) == 1
    cluster.start()
    poll(lambda: cluster.active_controller(), 30, what="a leader after restart")
    after = poll(
        lambda: kraft_json("topics", "describe", "--cluster", str(cluster.dir)), 30, what="describe"
    )
    assert {t["name"]: t["topic_id"] for t in after["topics"]} == {
        t["name"]: t["topic_id"] for t in before["topics"]
    }
    cluster.down()
    digests_after = {
        c["id"]: log_stream_digest(cluster.log_dir(c["id"])) for c in cluster.meta["controllers"]
    }
    # The restart added only the new leader's activation record on top of the same history.
    assert len(set(digests_after.values())) == 1


def _describe_node(cluster: LocalCluster, node_id: int) -> dict:
    c = cluster.controller(node_id)
    return call_sync(
        [(c["host"], c["rpc_port"])], "DescribeNode", {}, 10, credentials=cluster.credentials()
    )


def test_lagging_controller_installs_the_leaders_snapshot(cluster):
    """A controller that was down while the others compacted their Raft journals gets the
    leader's snapshot, continues its log from it, and keeps it across a restart."""
    cluster.up(controllers=3)
    cluster.down()
    for c in cluster.meta["controllers"]:
        with open(c["config"], "a") as f:
            f.write("raft.compaction.min.entries=20\n")
    cluster.start()
    cluster.start_sim_brokers(1)
    leader = poll(cluster.active_controller, 30, what="a leader")
    lagging = next(c["id"] for c in cluster.meta["controllers"] if c["id"] != leader)
    cluster.kill(lagging)
    for i in range(60):  # one Raft entry each (in-process calls: 60 CLI starts cost minutes)
        topic = {"name": f"while-down-{i}", "num_partitions": 1, "replication_factor": 1}
        reply = cluster.call("CreateTopics", {"topics": [topic]})
        assert reply["topics"][0]["error_code"] == 0, reply
    expected = {f"while-down-{i}" for i in range(60)}
    cluster.start(lagging)
    poll(
        lambda: expected <= _topic_names(cluster, lagging),
        60,
        what="the lagging controller to catch up",
    )

    def same_image():
        views = [_describe_node(cluster, c["id"]) for c in cluster.meta["controllers"]]
        return (
            views if len({(v["applied_offset"], v["image_checksum"]) for v in views}) == 1 else None
        )

    views = poll(same_image, 30, what="equal images on all controllers")
    node = next(v for v in views if v["node_id"] == lagging)
    assert node["log_start_offset"] > 0, (
        "the lagging controller should have started from a snapshot"
    )
    cluster.kill(lagging)
    cluster.start(lagging)
    poll(lambda: expected <= _topic_names(cluster, lagging), 60, what="topics after restarting it")
    kraft("topics", "create", "after-install", "--cluster", str(cluster.dir))
    poll(lambda: "after-install" in _topic_names(cluster, lagging), 30, what="new writes on it")


def test_an_invalid_create_topics_leaves_the_raft_commit_index_unchanged(cluster):
    """Only the active controller validates: a request that fails never reaches Raft."""
    cluster.up(controllers=3)
    leader = cluster.active_controller()

    def position() -> tuple[int, int]:
        node = cluster.call("DescribeNode", {"checksum": False}, node_id=leader)
        return node["raft"]["commit_index"], node["log_end_offset"]

    def settled() -> tuple[int, int] | None:  # activation and its commit notice are done
        first = position()
        return first if cluster.call("DescribeQuorum", {})["commit_index"] == first[0] else None

    before = poll(settled, 30, what="the leader's commit index to settle")
    bad = [
        {"name": "zero", "num_partitions": 0, "replication_factor": 1},  # INVALID_PARTITIONS
        {"name": "no-brokers", "num_partitions": 1, "replication_factor": 3},
        {"name": "bad/name", "num_partitions": 1, "replication_factor": 1},
    ]
    for topic in bad:
        reply = cluster.call("CreateTopics", {"topics": [topic]}, node_id=leader)
        assert reply["topics"][0]["error_code"] != 0, reply
    assert position() == before
    assert cluster.active_controller() == leader


def test_a_fence_of_thousands_of_partitions_steps_through_raft_and_logs_agree(cluster):
    """A broker leading and following thousands of partitions is fenced in several steps, two
    in flight at once (the next built while the last replicates): every partition ends led by
    a live broker without it, its fence record comes last, and the three controllers hold
    byte-identical logs."""
    import os
    import signal
    import subprocess
    import sys

    from tests.harness import ENV, REPO

    cluster.up(controllers=3)
    cluster.start_sim_brokers(2)  # 101, 102
    doomed = subprocess.Popen(
        [sys.executable, "-m", "testsupport.sim_broker", "--cluster", str(cluster.dir)]
        + ["--count", "1", "--first-id", "201"],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        line = poll(lambda: doomed.stdout.readline(), 60, what="broker 201 ready")
        assert line.strip() == "ready", line
        for i in range(3):  # 4,500 partitions, RF 3: broker 201 in every one, leading ~1/3
            reply = cluster.call(
                "CreateTopics",
                {"topics": [{"name": f"big-{i}", "num_partitions": 1500, "replication_factor": 3}]},
                timeout=60,
            )
            assert reply["topics"][0]["error_code"] == 0, reply
        os.killpg(doomed.pid, signal.SIGKILL)  # silent: fenced once its session expires
    finally:
        if doomed.poll() is None:
            os.killpg(doomed.pid, signal.SIGKILL)
        doomed.wait(10)

    def fenced_and_moved() -> bool:
        topics = kraft_json("topics", "describe", "--cluster", str(cluster.dir))["topics"]
        parts = [p for t in topics if t["name"].startswith("big-") for p in t["partitions"]]
        return len(parts) == 4500 and all(
            p["leader"] in (101, 102) and 201 not in p["isr"] for p in parts
        )

    poll(fenced_and_moved, 120, what="broker 201's partitions moved and its ISR places gone")
    for c in cluster.meta["controllers"]:  # every step reached Raft in the order proposed
        node_log = (cluster.dir / f"controller-{c['id']}" / "node.log").read_text()
        assert "does not continue the log" not in node_log, c["id"]
    desc = kraft_json("cluster", "describe", "--cluster", str(cluster.dir))["brokers"]
    assert next(b for b in desc if b["broker_id"] == 201)["state"] == "fenced"
    cluster.down()
    digests = {
        c["id"]: log_stream_digest(cluster.log_dir(c["id"])) for c in cluster.meta["controllers"]
    }
    assert len(set(digests.values())) == 1, digests
