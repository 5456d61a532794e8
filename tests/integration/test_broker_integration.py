"""Brokers as users meet them: 3 real controllers + 3 real brokers on loopback, the kraft CLI,
the brokers' state endpoint, and real Kafka clients."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from broker.state import describe as describe_broker
from tests.harness import LocalCluster, kraft, kraft_json, poll

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("brokers") / "cluster")
    c.up(3, 3, "--racks", "r1,r2,r3")
    try:
        yield c
    finally:
        c.down()


def brokers(cluster: LocalCluster) -> list[dict]:
    return cluster.meta["brokers"]


def state(b: dict) -> dict:
    return describe_broker(b["host"], b["admin_port"], timeout=5.0)


def partitions_of(cluster: LocalCluster, topic: str) -> list[dict]:
    return kraft_json("topics", "describe", topic, "--cluster", str(cluster.dir))["topics"][0][
        "partitions"
    ]


def local_roles(b: dict, topic: str) -> dict[int, tuple[str, int]]:
    return {
        p["partition"]: (p["role"], p["leader_epoch"])
        for p in state(b)["partitions"]
        if p["topic"] == topic
    }


def converged(cluster: LocalCluster, topic: str) -> bool:
    """Every live broker's local replicas and roles match the controller's assignment."""
    parts = partitions_of(cluster, topic)
    for b in brokers(cluster):
        try:
            roles = local_roles(b, topic)
        except OSError:
            continue  # a stopped broker
        expected = {
            p["partition"]: ("leader" if p["leader"] == b["id"] else "follower", p["leader_epoch"])
            for p in parts
            if b["id"] in p["replicas"]
        }
        if roles != expected:
            return False
    return True


def create_topic(cluster: LocalCluster, name: str, partitions: int, replication: int) -> None:
    kraft(
        "topics",
        "create",
        name,
        "--partitions",
        str(partitions),
        "--replication-factor",
        str(replication),
        "--cluster",
        str(cluster.dir),
    )


def broker_state(cluster: LocalCluster, broker_id: int) -> str:
    desc = kraft_json("cluster", "describe", "--cluster", str(cluster.dir))
    return next(b["state"] for b in desc["brokers"] if b["broker_id"] == broker_id)


def test_brokers_run_and_follow_the_assignment(cluster):
    for b in brokers(cluster):
        poll(lambda: state(b)["state"] == "RUNNING", 30, what=f"broker {b['id']} RUNNING")
    create_topic(cluster, "orders", 6, 3)
    poll(lambda: converged(cluster, "orders"), 30, what="brokers to take their roles")
    for p in partitions_of(cluster, "orders"):
        assert len({b for b in p["replicas"]}) == 3  # one replica per rack

    # All brokers report the same image checksum at the same offset.
    def same_checksum():
        views = [state(b) for b in brokers(cluster)]
        offsets = {v["last_applied_offset"] for v in views}
        return len(offsets) == 1 and len({v["image_checksum"] for v in views}) == 1

    poll(same_checksum, 30, what="equal image checksums at one offset")


def test_a_broker_tells_when_it_published_each_metadata_image(cluster):
    """DescribePublishes on the admin endpoint: (offset, time) of the latest publishes, in
    order, the last one the image the broker serves (the propagation bench reads it)."""
    b = brokers(cluster)[0]
    kraft("topics", "create", "published", "--cluster", str(cluster.dir))
    applied = poll(
        lambda: (lambda s: s["last_applied_offset"] if s["partitions"] else None)(state(b)),
        30,
        what="the broker to apply the topic",
    )
    answer = describe_broker(b["host"], b["admin_port"], timeout=5.0, api="DescribePublishes")
    publishes = answer["publishes"]
    offsets = [offset for offset, _ in publishes]
    times = [t for _, t in publishes]
    assert offsets == sorted(offsets) and times == sorted(times)
    assert offsets[-1] >= applied and abs(times[-1] - time.time()) < 600
    bad = describe_broker(b["host"], b["admin_port"], timeout=5.0, api="NoSuchApi")
    assert "unsupported request" in bad["error"]


def test_real_kafka_clients_see_the_topics(cluster):
    create_topic(cluster, "visible", 2, 2)
    bootstrap = ",".join(f"{b['host']}:{b['port']}" for b in brokers(cluster))
    from kafka import KafkaConsumer

    def kafka_python_sees():
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=5000)
        try:
            return "visible" in consumer.topics()
        finally:
            consumer.close()

    poll(kafka_python_sees, 30, what="kafka-python to list the topic")
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed")
    out = subprocess.run(
        [kcat, "-b", bootstrap, "-L", "-J"], capture_output=True, text=True, timeout=30
    )
    listed = {t["topic"] for t in json.loads(out.stdout)["topics"]}
    assert "visible" in listed


def test_deleted_topic_directories_disappear(cluster):
    create_topic(cluster, "doomed", 3, 3)
    poll(lambda: converged(cluster, "doomed"), 30, what="doomed partitions on brokers")
    dirs = [Path(d) for b in brokers(cluster) for d in b["log_dirs"].split(",")]
    assert any(list(d.glob("doomed-*")) for d in dirs)
    kraft("topics", "delete", "doomed", "--cluster", str(cluster.dir))
    poll(
        lambda: not any(list(d.glob("doomed-*")) for d in dirs),
        30,
        what="partition directories to be deleted",
    )


def test_killed_broker_is_fenced_and_comes_back_as_follower(cluster):
    create_topic(cluster, "failover", 3, 3)
    poll(lambda: converged(cluster, "failover"), 30, what="initial roles")
    victim = partitions_of(cluster, "failover")[0]["leader"]
    cluster.kill(victim)
    poll(
        lambda: broker_state(cluster, victim) == "fenced", 30, what="the killed broker to be fenced"
    )
    parts = poll(
        lambda: (lambda ps: ps if all(p["leader"] not in (victim, -1) for p in ps) else None)(
            partitions_of(cluster, "failover")
        ),
        30,
        what="new leaders",
    )
    assert all(victim not in p["isr"] for p in parts)
    poll(lambda: converged(cluster, "failover"), 30, what="survivors to follow the new leaders")
    cluster.start(victim)
    poll(
        lambda: broker_state(cluster, victim) == "unfenced",
        60,
        what="the restarted broker to be unfenced",
    )
    vb = next(b for b in brokers(cluster) if b["id"] == victim)
    poll(
        lambda: (
            all(role == "follower" for role, _ in local_roles(vb, "failover").values())
            and len(local_roles(vb, "failover")) == 3
        ),
        30,
        what="the restarted broker to follow",
    )


def test_a_broker_restarted_on_its_own_disks_keeps_its_leaderships(cluster):
    """kill -9 and an immediate restart: the new process proves its log dirs (broker.epoch), so
    once the old session expires it replaces the registration instead of being fenced first:
    no leadership moves, no leader epoch is bumped, and it leads again once unfenced."""
    create_topic(cluster, "comeback", 3, 3)
    poll(lambda: converged(cluster, "comeback"), 30, what="initial roles")
    before = {
        p["partition"]: (p["leader"], p["leader_epoch"]) for p in partitions_of(cluster, "comeback")
    }
    victim = before[0][0]
    epoch_before = next(
        b["epoch"]
        for b in kraft_json("cluster", "describe", "--cluster", str(cluster.dir))["brokers"]
        if b["broker_id"] == victim
    )
    cluster.kill(victim)
    cluster.start(victim)

    def registered_again() -> bool:
        desc = kraft_json("cluster", "describe", "--cluster", str(cluster.dir))["brokers"]
        b = next(b for b in desc if b["broker_id"] == victim)
        return b["epoch"] != epoch_before and b["state"] == "unfenced"

    poll(registered_again, 60, what="the restarted broker registered again and unfenced")
    after = {
        p["partition"]: (p["leader"], p["leader_epoch"]) for p in partitions_of(cluster, "comeback")
    }
    assert after == before
    poll(lambda: converged(cluster, "comeback"), 30, what="the broker to lead again")
    poll(
        lambda: all(victim in p["isr"] for p in partitions_of(cluster, "comeback")),
        60,
        what="the restarted broker back in every ISR",
    )


def test_sigterm_moves_leadership_before_exit(cluster):
    create_topic(cluster, "graceful", 3, 3)
    poll(lambda: converged(cluster, "graceful"), 30, what="initial roles")
    victim = partitions_of(cluster, "graceful")[1]["leader"]
    cluster.kill(victim, "TERM")
    vb = next(b for b in cluster.meta["brokers"] if b["id"] == victim)
    poll(
        lambda: vb["pid"] is None or not Path(f"/proc/{vb['pid']}").exists(),
        30,
        what="the broker to exit",
    )
    parts = partitions_of(cluster, "graceful")
    assert all(p["leader"] != victim for p in parts), parts
    cluster.start(victim)
    poll(lambda: broker_state(cluster, victim) == "unfenced", 60, what="the broker to come back")


def test_controller_failover_keeps_brokers_unfenced(cluster):
    create_topic(cluster, "steady", 3, 3)
    poll(lambda: converged(cluster, "steady"), 30, what="initial roles")
    for b in brokers(cluster):
        poll(
            lambda: broker_state(cluster, b["id"]) == "unfenced",
            60,
            what=f"broker {b['id']} unfenced",
        )
    before = partitions_of(cluster, "steady")
    old = cluster.active_controller()
    cluster.kill(old)
    new = poll(
        lambda: (lambda n: n if n != old else None)(cluster.active_controller()),
        30,
        what="a new controller",
    )
    assert new != old
    # Watch for longer than a broker session (9 s): no broker may be fenced by mistake.
    deadline = time.monotonic() + 11
    while time.monotonic() < deadline:
        desc = kraft_json("cluster", "describe", "--cluster", str(cluster.dir))
        assert all(b["state"] == "unfenced" for b in desc["brokers"]), desc
        time.sleep(0.5)
    kraft("topics", "create", "after-failover", "--cluster", str(cluster.dir))
    poll(
        lambda: (
            sum(
                "after-failover" in {p["topic"] for p in state(b)["partitions"]}
                for b in brokers(cluster)
            )
            == 1
        ),
        30,
        what="the new topic's replica on one broker",
    )
    assert partitions_of(cluster, "steady") == before
    cluster.start(old)


def test_elect_leaders_gives_leadership_back_to_preferred_replicas(cluster):
    create_topic(cluster, "preferred", 3, 3)
    poll(lambda: converged(cluster, "preferred"), 30, what="initial roles")
    victim = partitions_of(cluster, "preferred")[0]["replicas"][0]
    cluster.kill(victim, "TERM")
    vb = next(b for b in cluster.meta["brokers"] if b["id"] == victim)
    poll(
        lambda: vb["pid"] is None or not Path(f"/proc/{vb['pid']}").exists(),
        30,
        what="the broker to exit",
    )
    cluster.start(victim)
    poll(
        lambda: all(victim in p["isr"] for p in partitions_of(cluster, "preferred")),
        60,
        what="the restarted broker back in every ISR",
    )
    moved = [p for p in partitions_of(cluster, "preferred") if p["leader"] != p["replicas"][0]]
    assert moved, "a restarted broker does not take leadership back by itself"

    out = kraft_json(
        "topics", "elect-leaders", "--topic", "preferred", "--cluster", str(cluster.dir)
    )
    assert out["election_type"] == "preferred"
    by_partition = {r["partition"]: r for r in out["partitions"]}
    for p in moved:
        assert by_partition[p["partition"]]["error"] == "NONE"
        assert by_partition[p["partition"]]["leader"] == p["replicas"][0]
    assert all(p["leader"] == p["replicas"][0] for p in partitions_of(cluster, "preferred"))
    poll(lambda: converged(cluster, "preferred"), 30, what="brokers to follow the elections")

    again = kraft("topics", "elect-leaders", "--topic", "preferred", "--cluster", str(cluster.dir))
    assert again.returncode == 0 and "needs no preferred election" in again.stdout
    unknown = kraft(
        "topics", "elect-leaders", "--topic", "nope", "--cluster", str(cluster.dir), check=False
    )
    assert unknown.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in unknown.stderr
    usage = kraft(
        "topics", "elect-leaders", "--partition", "0", "--cluster", str(cluster.dir), check=False
    )
    assert usage.returncode == 2 and "--partition needs --topic" in usage.stderr
