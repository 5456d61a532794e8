"""Broker metadata replay against real controllers: 3 controller processes + 2 broker processes
on loopback, driven through the ``kraft`` CLI, the brokers' state endpoint and the controllers'
``DescribeNode`` RPC. What is checked here (roles, fencing, controlled shutdown, deletes and real
Kafka clients are in test_broker_integration.py):

* a broker's image (checksum, applied offset) equals every controller's after creates, deletes
  and config changes;
* a restarted broker resumes from its local checkpoint (not offset 0) and catches up;
* a corrupt checkpoint is set aside as ``*.corrupt`` and the broker still converges;
* losing the controller a broker fetches from (and the active controller) does not stop replay
  or cause a second registration;
* a broker with another cluster's id exits 1 and says why.

Loading a controller snapshot with FetchSnapshot (a broker behind a controller whose retention
deleted the segments it needs) is in test_retention.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from broker.state import describe
from kraft.log.snapshot import list_snapshots, read_snapshot_header
from kraft.rpc.client import call_sync
from tests.harness import ENV, REPO, LocalCluster, kraft, poll
from tools.free_ports import pick_free_ports

pytestmark = pytest.mark.integration

TIMEOUT = 30  # seconds for any one condition to become true


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("replay") / "cluster")
    try:
        c.up(3, 2)
        yield c
    finally:
        c.down()


# ---- helpers --------------------------------------------------------------------------------


def broker(cluster: LocalCluster, broker_id: int) -> dict:
    return next(b for b in cluster.meta["brokers"] if b["id"] == broker_id)


def state(b: dict) -> dict:
    return describe(b["host"], b["admin_port"], timeout=5.0)


def controller_views(
    cluster: LocalCluster, ids: list[int] | None = None
) -> dict[int, tuple[int, str]]:
    """(applied offset, image checksum) of each controller in ``ids`` (default: all), asked
    directly (DescribeNode is answered by the controller you reach)."""
    views = {}
    for c in cluster.meta["controllers"]:
        if ids is None or c["id"] in ids:
            r = call_sync(
                [(c["host"], c["rpc_port"])],
                "DescribeNode",
                {},
                timeout=5.0,
                credentials=cluster.credentials(),
            )
            views[c["id"]] = (r["applied_offset"], r["image_checksum"])
    return views


def in_sync(cluster: LocalCluster, broker_ids: list[int], controller_ids: list[int] | None = None):
    """The common (offset, checksum) when every listed broker is RUNNING with exactly the
    controllers' image; None otherwise."""
    views = set(controller_views(cluster, controller_ids).values())
    if len(views) != 1:
        return None
    ((offset, checksum),) = views
    for bid in broker_ids:
        s = state(broker(cluster, bid))
        if s["state"] != "RUNNING" or (s["last_applied_offset"], s["image_checksum"]) != (
            offset,
            checksum,
        ):
            return None
    return offset, checksum


def stop_broker(cluster: LocalCluster, broker_id: int) -> None:
    """SIGTERM (controlled shutdown, which checkpoints) and wait for the process to exit."""
    kraft(
        "cluster",
        "kill",
        "--dir",
        str(cluster.dir),
        "--node",
        str(broker_id),
        "--signal",
        "TERM",
        "--timeout",
        str(TIMEOUT),
        timeout=TIMEOUT + 15,
    )


def newest_checkpoint(b: dict) -> Path:
    snaps = list_snapshots(Path(b["log_dirs"].split(",")[0]) / "metadata")
    assert snaps, f"broker {b['id']} wrote no metadata checkpoint"
    return snaps[-1]


def log_size(b: dict) -> int:
    path = Path(b["log_file"])
    return path.stat().st_size if path.exists() else 0


def log_since(b: dict, position: int) -> str:
    with open(b["log_file"], "rb") as f:
        f.seek(position)
        return f.read().decode("utf-8", "replace")


def topics(*args: str, cluster: LocalCluster) -> None:
    kraft("topics", *args, "--cluster", str(cluster.dir))


def partitions_of(b: dict, topic: str) -> set[int]:
    return {p["partition"] for p in state(b)["partitions"] if p["topic"] == topic}


def free_port() -> int:
    return pick_free_ports(1)[0]


def fetch_controller(cluster: LocalCluster, broker_id: int, active: int) -> int | None:
    """The controller the broker's metadata fetcher is connected to. A broker holds two
    controller connections: heartbeats (to the active controller) and fetches (to whichever
    controller it reached); so the fetch target is the non-active one, or the active one if
    both connections go there."""
    ports = {c["rpc_port"]: c["id"] for c in cluster.meta["controllers"]}
    conns = [
        ports[c.raddr.port]
        for c in psutil.Process(broker(cluster, broker_id)["pid"]).net_connections("tcp")
        if c.raddr and c.raddr.port in ports and c.status == psutil.CONN_ESTABLISHED
    ]
    if len(conns) != 2 or active not in conns:
        return None  # reconnecting: ask again
    others = [c for c in conns if c != active]
    return others[0] if others else active


# ---- tests ----------------------------------------------------------------------------------


def test_broker_image_equals_the_controllers(cluster):
    topics("create", "replay-a", "--partitions", "3", "--replication-factor", "2", cluster=cluster)
    topics("create", "replay-b", "--partitions", "2", "--replication-factor", "1", cluster=cluster)
    topics("create", "replay-c", "--partitions", "1", "--replication-factor", "2", cluster=cluster)
    kraft(
        "configs",
        "alter",
        "--topic",
        "replay-a",
        "--set",
        "cleanup.policy=compact",
        "--set",
        "max.message.bytes=2000000",
        "--cluster",
        str(cluster.dir),
    )
    kraft(
        "configs",
        "alter",
        "--broker-defaults",
        "--set",
        "min.insync.replicas=2",
        "--cluster",
        str(cluster.dir),
    )
    topics("delete", "replay-b", cluster=cluster)
    topics("add-partitions", "replay-c", "--partitions", "3", cluster=cluster)
    offset, checksum = poll(
        lambda: in_sync(cluster, [101, 102]),
        TIMEOUT,
        what="both brokers at the controllers' offset and checksum",
    )
    assert offset >= 7  # every change above is in the image both sides agree on
    for bid in (101, 102):
        parts = state(broker(cluster, bid))["partitions"]
        assert {p["topic"] for p in parts} <= {"replay-a", "replay-c"}
    together = [p for bid in (101, 102) for p in state(broker(cluster, bid))["partitions"]]
    assert sorted({(p["topic"], p["partition"]) for p in together}) == [
        ("replay-a", 0),
        ("replay-a", 1),
        ("replay-a", 2),
        ("replay-c", 0),
        ("replay-c", 1),
        ("replay-c", 2),
    ]


def test_restart_resumes_from_the_checkpoint(cluster):
    b = broker(cluster, 102)
    topics(
        "create", "resume-doomed", "--partitions", "2", "--replication-factor", "2", cluster=cluster
    )
    poll(
        lambda: partitions_of(b, "resume-doomed") == {0, 1},
        TIMEOUT,
        what="broker 102 to host resume-doomed",
    )
    before = poll(
        lambda: (s := state(b))["state"] == "RUNNING" and s, TIMEOUT, what="broker 102 RUNNING"
    )
    stop_broker(cluster, 102)
    checkpoint = newest_checkpoint(b)
    saved = read_snapshot_header(checkpoint).end_offset - 1
    assert saved >= before["last_applied_offset"]
    # The log moves on while the broker is down (replicas can only go to broker 101 now).
    topics(
        "create", "while-down-1", "--partitions", "2", "--replication-factor", "1", cluster=cluster
    )
    topics(
        "create", "while-down-2", "--partitions", "1", "--replication-factor", "1", cluster=cluster
    )
    topics("delete", "resume-doomed", cluster=cluster)
    target = max(o for o, _ in controller_views(cluster).values())
    assert target > saved
    position = log_size(b)
    cluster.start(102)
    b = broker(cluster, 102)
    offset, _ = poll(
        lambda: in_sync(cluster, [101, 102]), TIMEOUT, what="restarted broker 102 in sync"
    )
    assert offset >= target
    after = state(b)
    assert (
        after["incarnation_id"] != before["incarnation_id"]
        and after["broker_epoch"] > before["broker_epoch"]
    )
    assert partitions_of(b, "resume-doomed") == set()  # deleted while it was down: strays removed
    assert not list(Path(b["log_dirs"].split(",")[0]).glob("resume-doomed-*"))
    # It resumed from the checkpoint: loaded it, and its first (full) publish started there, not at -1.
    text = log_since(b, position)
    assert f"loaded metadata checkpoint {checkpoint.name}: offset {saved}," in text, text
    first = re.search(r"published metadata offset (\d+) \(from (-?\d+), full", text)
    assert first is not None, text
    assert int(first.group(2)) == saved and int(first.group(1)) >= target, first.group(0)
    assert "(from -1" not in text


def test_corrupt_checkpoint_is_set_aside(cluster):
    b = broker(cluster, 102)
    topics(
        "create", "corrupt-kept", "--partitions", "3", "--replication-factor", "2", cluster=cluster
    )
    poll(
        lambda: partitions_of(b, "corrupt-kept") == {0, 1, 2},
        TIMEOUT,
        what="broker 102 to host corrupt-kept",
    )
    stop_broker(cluster, 102)
    metadata_dir = newest_checkpoint(b).parent
    snaps = list_snapshots(metadata_dir)
    victim = snaps[-1]
    older = snaps[-2] if len(snaps) > 1 else None
    raw = bytearray(victim.read_bytes())
    for i in (len(raw) // 2, len(raw) - 5):  # a record frame and the SHA-256 footer
        raw[i] ^= 0xFF
    victim.write_bytes(bytes(raw))
    topics(
        "create",
        "after-corruption",
        "--partitions",
        "1",
        "--replication-factor",
        "1",
        cluster=cluster,
    )
    position = log_size(b)
    cluster.start(102)
    b = broker(cluster, 102)
    poll(
        lambda: in_sync(cluster, [101, 102]),
        TIMEOUT,
        what="broker 102 in sync after a corrupt checkpoint",
    )
    assert partitions_of(b, "corrupt-kept") == {0, 1, 2}  # its replicas are back
    assert (metadata_dir / (victim.name + ".corrupt")).exists()
    assert not victim.exists()
    text = log_since(b, position)
    assert re.search(
        rf"WARNING .*metadata checkpoint .*{re.escape(victim.name)} is corrupt", text
    ), text
    if older is not None:  # it fell back to the previous checkpoint and replayed the rest
        saved = read_snapshot_header(older).end_offset - 1
        assert f"loaded metadata checkpoint {older.name}: offset {saved}," in text, text
        assert re.search(rf"published metadata offset \d+ \(from {saved}, full", text), text
    else:  # nothing else to load: refetched from the start
        assert "published metadata offset" in text and "(from -1, full" in text, text
    assert "replay failed" not in text


def test_wrong_cluster_id_is_fatal(cluster, tmp_path):
    source = Path(broker(cluster, 101)["config"]).read_text().splitlines()
    overrides = {
        "node.id": "150",
        "cluster.id": "not-this-cluster",
        "listeners": f"PLAINTEXT://127.0.0.1:{free_port()}",
        "log.dirs": str(tmp_path / "data"),
        "broker.admin.port": str(free_port()),
    }
    lines = [line for line in source if line.split("=", 1)[0].strip() not in overrides]
    lines += [f"{k}={v}" for k, v in overrides.items()]
    config = tmp_path / "broker.properties"
    config.write_text("\n".join(lines) + "\n")
    kraft("storage", "format", "--config", str(config))  # its own directory: this cluster id
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.cli", "broker", "--config", str(config)],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 1, (out, err)
    assert "INCONSISTENT_CLUSTER_ID" in err and "not-this-cluster" in err, err
    assert "fatal" in err
    desc = kraft("cluster", "describe", "--cluster", str(cluster.dir), "--json").stdout
    assert '"broker_id": 150' not in desc  # the controllers never registered it


def test_losing_the_fetch_controller_and_the_active_controller(cluster):
    """Kill -9 the controller broker 101 fetches from, then the active controller (the same one
    if it fetches from the active controller), one at a time: after each failover the brokers
    replay new topics with the broker epochs they had, i.e. they never re-registered."""
    b = broker(cluster, 101)
    poll(lambda: in_sync(cluster, [101, 102]), TIMEOUT, what="brokers in sync before the failovers")
    epochs = {
        bid: (s["broker_epoch"], s["incarnation_id"])
        for bid in (101, 102)
        for s in [state(broker(cluster, bid))]
    }
    active = cluster.active_controller()
    fetching = poll(
        lambda: fetch_controller(cluster, 101, active),
        TIMEOUT,
        what="broker 101's fetch connection",
    )
    victims = [fetching] + ([active] if active != fetching else [])
    down: list[int] = []
    try:
        for round_no, victim in enumerate(victims):
            if round_no > 0:
                victim = cluster.active_controller()  # the active one now (it may have moved)
            cluster.kill(victim, "KILL")
            down.append(victim)
            alive = [c["id"] for c in cluster.meta["controllers"] if c["id"] != victim]
            topic = f"after-loss-{round_no}"
            kraft(
                "topics",
                "create",
                topic,
                "--partitions",
                "2",
                "--replication-factor",
                "2",
                "--cluster",
                str(cluster.dir),
                "--timeout",
                str(TIMEOUT),
                timeout=TIMEOUT + 15,
            )
            poll(
                lambda: partitions_of(b, topic) == {0, 1},
                TIMEOUT,
                what=f"broker 101 to replay {topic}",
            )
            poll(
                lambda: in_sync(cluster, [101, 102], alive),
                TIMEOUT,
                what=f"brokers in sync with the surviving controllers after losing controller {victim}",
            )
            for bid in (101, 102):
                s = state(broker(cluster, bid))
                assert (s["broker_epoch"], s["incarnation_id"]) == epochs[bid], (
                    bid,
                    s,
                    epochs[bid],
                )
            kraft(
                "cluster",
                "start",
                "--dir",
                str(cluster.dir),
                "--node",
                str(victim),
                "--wait",
                "--ready-timeout",
                str(TIMEOUT),
                timeout=TIMEOUT + 30,
            )
            down.remove(victim)
            poll(
                lambda: in_sync(cluster, [101, 102]),
                TIMEOUT,
                what=f"controller {victim} back in sync",
            )
    finally:
        for victim in down:
            kraft(
                "cluster",
                "start",
                "--dir",
                str(cluster.dir),
                "--node",
                str(victim),
                check=False,
                timeout=TIMEOUT + 30,
            )
