"""Prometheus metrics: the counts derived from an image and a broker's replicas (pure), and the
real endpoints of a 3-controller + 2-broker cluster scraped and parsed with prometheus_client's
text parser, before and after the active controller is killed; on the same cluster,
``kraft quorum replication`` lists the 3 voters and the brokers as observers with sane offsets."""

from __future__ import annotations

import socket
import urllib.request
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from harness import LocalCluster, kraft, kraft_json, poll
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import replica_counts
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metrics import ImageCounts
from kraft.records import LEADER_NONE, RECOVERED, PartitionRecord, RegisterBrokerRecord, TopicRecord

KC = "kafka_controller_kafkacontroller_"


def _image() -> MetadataImage:
    endpoints = (
        {"name": "PLAINTEXT", "host": "localhost", "port": 9092, "security_protocol": "PLAINTEXT"},
    )
    t1, t2 = str(uuid.UUID(int=1)), str(uuid.UUID(int=2))

    def part(tid: str, pid: int, replicas: tuple[int, ...], leader: int) -> PartitionRecord:
        return PartitionRecord(pid, tid, replicas, replicas, (), (), leader, RECOVERED, 0, 0)

    delta = MetadataDelta(MetadataImage.EMPTY)
    for r in (
        RegisterBrokerRecord(1, str(uuid.UUID(int=11)), 1, endpoints, (), None, False, False),
        RegisterBrokerRecord(2, str(uuid.UUID(int=12)), 1, endpoints, (), None, True, False),
        RegisterBrokerRecord(3, str(uuid.UUID(int=13)), 1, endpoints, (), None, False, False),
        TopicRecord("a", t1),
        part(t1, 0, (1, 3), 1),
        part(t1, 1, (3, 1), 1),
        part(t1, 2, (2,), LEADER_NONE),
        TopicRecord("b", t2),
        part(t2, 0, (3, 1), 3),
        part(t2, 1, (2, 1), 2),  # led by a fenced broker (kept after its disks' proof): offline
    ):
        delta.replay(r)
    return delta.apply()


FSC = "kafka_server_fetchsessioncache_"


def test_image_counts() -> None:
    assert ImageCounts.of(_image()) == ImageCounts(
        topics=2,
        partitions=5,
        offline_partitions=2,
        preferred_replica_imbalance=1,
        fenced_brokers=1,
        active_brokers=2,
    )
    assert ImageCounts.of(MetadataImage.EMPTY) == ImageCounts(0, 0, 0, 0, 0, 0)


def test_replica_counts() -> None:
    def p(role: str, leader: int, isr: tuple, replicas: tuple) -> SimpleNamespace:
        return SimpleNamespace(role=role, leader=leader, isr=isr, replicas=replicas)

    parts = [
        p("leader", 7, (7, 8), (7, 8)),
        p("leader", 7, (7,), (7, 8, 9)),
        p("follower", 8, (8, 7), (8, 7)),
    ]
    assert replica_counts(7, parts) == (3, 2, 1)
    assert replica_counts(7, []) == (0, 0, 0)


# ---- real processes -------------------------------------------------------------------------------


@pytest.mark.integration
def test_a_metrics_port_in_use_stops_the_controller_with_a_clear_error(tmp_path: Path) -> None:
    from tools.cluster import pick_free_ports

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rpc, raft = pick_free_ports(2)
        config = tmp_path / "controller.properties"
        secret = tmp_path / "raft.secret"
        secret.write_text("metrics-test-raft-secret-of-32-b\n")
        secret.chmod(0o600)
        config.write_text(
            f"node.id=1\nprocess.roles=controller\ncluster.id=c\n"
            f"controller.raft.secret.file={secret}\n"
            f"controller.quorum.voters=1@127.0.0.1:{rpc}\n"
            f"controller.quorum.raft.voters=1@127.0.0.1:{raft}\n"
            f"metadata.log.dir={tmp_path / 'meta'}\nmetrics.port={port}\n"
        )
        kraft("storage", "format", "--config", str(config), "--initial-controllers")
        proc = kraft("controller", "--config", str(config), check=False, timeout=60)
    assert proc.returncode == 1
    assert (
        f"Error: [Errno 98] metrics.port: cannot serve metrics on 127.0.0.1:{port}" in proc.stderr
    )
    assert "Traceback" not in proc.stderr


def scrape(port: int) -> dict[str, float]:
    """name → value of every sample (histogram samples keep their _count/_sum/_bucket names)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.labels or (set(s.labels) == {"le"} and s.labels["le"] == "+Inf")
    }


def replication(cluster: LocalCluster) -> tuple[dict, dict[int, dict]]:
    """``kraft quorum replication --json`` and its rows by node id."""
    doc = kraft_json("quorum", "replication", "--cluster", str(cluster.dir))
    return doc, {r["node_id"]: r for r in doc["replicas"]}


def check_replication_settled(cluster: LocalCluster) -> dict:
    """Every voter and broker caught up; exactly one leader; brokers are observers."""

    def settled() -> dict | None:
        doc, rows = replication(cluster)
        ok = (
            sorted(rows) == [1, 2, 3, 101, 102]
            and all(r["lag"] == 0 for r in rows.values())
            and all(r["applied_offset"] == doc["high_watermark"] - 1 for r in rows.values())
        )
        return doc if ok else None

    doc = poll(settled, 60, interval=0.5, what="every voter and broker caught up")
    rows = {r["node_id"]: r for r in doc["replicas"]}
    assert [rows[i]["status"] for i in (1, 2, 3)].count("Leader") == 1
    assert rows[doc["leader_id"]]["status"] == "Leader"
    assert rows[101]["status"] == rows[102]["status"] == "Observer"
    assert all(0 <= rows[b]["last_fetch_ms_ago"] < 15_000 for b in (101, 102))  # heartbeats: 2 s
    status = kraft_json("quorum", "status", "--cluster", str(cluster.dir))
    assert status["cluster_id"] == cluster.meta["cluster_id"]
    assert status["current_voters"] == [1, 2, 3] and status["current_observers"] == [101, 102]
    assert status["leader_epoch"] == status["term"] >= 1 and status["max_follower_lag"] == 0
    return doc


@pytest.mark.integration
def test_metrics_and_replication_across_a_failover(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c").up(3, 2, "--metrics", "--fsync", "never")
    try:
        meta = cluster.meta
        ports = {n["id"]: n["metrics_port"] for n in meta["controllers"] + meta["brokers"]}
        assert len(set(ports.values())) == 5 and all(ports.values())
        kraft(
            "topics",
            "create",
            "m",
            "--partitions",
            "2",
            "--replication-factor",
            "2",
            "--cluster",
            str(cluster.dir),
        )

        def controllers_agree(ids: list[int]) -> dict[int, dict[str, float]] | None:
            views = {i: scrape(ports[i]) for i in ids}
            active = [i for i, v in views.items() if v[KC + "activecontrollercount"] == 1]
            offsets = {v[KC + "lastappliedrecordoffset"] for v in views.values()}
            return views if len(active) == 1 and len(offsets) == 1 else None

        views = poll(
            lambda: controllers_agree([1, 2, 3]),
            60,
            interval=0.3,
            what="one active controller and equal applied offsets",
        )
        old = cluster.active_controller()
        assert views[old][KC + "activecontrollercount"] == 1
        for v in views.values():
            assert v[KC + "globaltopiccount"] == 1 and v[KC + "globalpartitioncount"] == 2
            assert v[KC + "offlinepartitionscount"] == 0
            assert v[KC + "activebrokercount"] == 2 and v[KC + "fencedbrokercount"] == 0
            assert v["kafka_server_raft_metrics_current_leader"] == old
            assert v[KC + "lastappliedrecordlagms"] >= 0
        assert views[old]["kafka_server_raft_metrics_commit_latency_ms_count"] >= 1

        def brokers_caught_up() -> list[dict[str, float]] | None:
            offset = scrape(ports[old])[KC + "lastappliedrecordoffset"]
            b = [scrape(ports[i]) for i in (101, 102)]
            ok = (
                all(
                    x["kafka_server_broker_metadata_metrics_last_applied_record_offset"] == offset
                    for x in b
                )
                and sum(x["kafka_server_replicamanager_partitioncount"] for x in b) == 4
            )
            return b if ok else None

        brokers = poll(
            brokers_caught_up, 60, interval=0.3, what="brokers at the controllers' offset"
        )
        assert sum(b["kafka_server_replicamanager_leadercount"] for b in brokers) == 2
        for b in brokers:
            assert b["kafka_server_kafkaserver_brokerstate"] == 3  # RUNNING
            assert b["kafka_server_replicamanager_underreplicatedpartitions"] == 0
            assert b["kafka_server_broker_metadata_metrics_metadata_load_error_count"] >= 0

        def followers_in_sessions() -> bool:
            """Each broker leads one partition the other follows: its follower fetches come in
            an incremental fetch session (KIP-227)."""
            b = [scrape(ports[i]) for i in (101, 102)]
            return all(
                x[FSC + "numincrementalfetchsessions"] >= 1
                and x[FSC + "numincrementalfetchpartitionscached"] >= 1
                and x["pykraft_broker_incremental_fetch_count"] >= 1
                for x in b
            )

        poll(followers_in_sessions, 30, interval=0.3, what="incremental follower fetch sessions")

        before = check_replication_settled(cluster)
        assert before["leader_id"] == old

        killed = kraft_json("cluster", "kill", "--dir", str(cluster.dir), "--node", str(old))
        assert killed == {
            "node": old,
            "role": "controller",
            "pid": killed["pid"],
            "signal": "KILL",
            "exited": True,
        }
        survivors = [i for i in (1, 2, 3) if i != old]

        def new_active() -> dict[int, dict[str, float]] | None:
            views = controllers_agree(survivors)
            return (
                views
                if views
                and views[survivors[0]]["kafka_server_raft_metrics_current_leader"] in survivors
                else None
            )

        views = poll(
            new_active, 60, interval=0.3, what="exactly one active controller among the survivors"
        )
        active = [i for i, v in views.items() if v[KC + "activecontrollercount"] == 1]
        assert len(active) == 1 and active[0] != old
        assert (
            views[active[0]]["kafka_server_raft_metrics_commit_latency_ms_count"] >= 1
        )  # its activation
        assert views[active[0]]["kafka_server_raft_metrics_current_epoch"] > 1
        with pytest.raises(OSError):
            scrape(ports[old])  # the killed controller's endpoint is gone

        def new_leader_sees_all() -> tuple[dict, dict[int, dict]] | None:
            doc, rows = replication(cluster)
            ok = (
                doc["leader_id"] == active[0]
                and {101, 102} <= set(rows)
                and rows[old]["applied_offset"] is None  # dead: no applied offset to report
                and all(rows[b]["lag"] == 0 for b in (101, 102))
            )
            return (doc, rows) if ok else None

        after, rows = poll(
            new_leader_sees_all, 60, interval=0.5, what="the new leader hearing from the brokers"
        )
        assert after["high_watermark"] > before["high_watermark"]  # the new leader's LeaderChange
        assert rows[active[0]]["status"] == "Leader" and rows[old]["status"] == "Follower"
        assert rows[active[0]]["applied_offset"] == after["high_watermark"] - 1
        text = kraft("quorum", "replication", "--cluster", str(cluster.dir)).stdout
        assert text.splitlines()[0].startswith("NODE ID")
        assert sum("Observer" in line.split() for line in text.splitlines()) == 2

        restarted = kraft_json(
            "cluster", "start", "--dir", str(cluster.dir), "--node", str(old), "--wait"
        )
        assert [n["id"] for n in restarted["started"]] == [old]
        assert "1/1 restarted controllers joined" in restarted["ready"]
        assert (
            poll(lambda: scrape(ports[old]), 30, what="the restarted controller's endpoint")[
                KC + "activecontrollercount"
            ]
            == 0
        )  # a follower now
    finally:
        cluster.down()
