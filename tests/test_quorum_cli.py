"""``kraft quorum status|replication``: Kafka-shaped rendering (from a canned DescribeQuorum
response) and, on a real 3-controller + 2-broker cluster, voters and observers with sane offsets
before and after the active controller is killed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import LocalCluster, kraft, kraft_json, poll
from tools import cli
from tools.commands import common
from tools.commands.quorum import max_follower_lag, max_follower_lag_time_ms, replication_rows

BOOT = ["--bootstrap-controller", "127.0.0.1:9093"]

QUORUM = {"cluster_id": "cid", "leader_id": 2, "term": 5, "commit_index": 40, "high_watermark": 31,
          "voters": [
              {"node_id": 1, "host": "127.0.0.1", "port": 9001, "applied_offset": 28, "lag": 3,
               "last_contact_ms": 12, "last_caught_up_ms": None, "is_leader": False},
              {"node_id": 2, "host": "127.0.0.1", "port": 9002, "applied_offset": 30, "lag": 0,
               "last_contact_ms": 0, "last_caught_up_ms": 0, "is_leader": True},
              {"node_id": 3, "host": "127.0.0.1", "port": 9003, "applied_offset": None, "lag": None,
               "last_contact_ms": 4000, "last_caught_up_ms": None, "is_leader": False}],
          "observers": [{"broker_id": 101, "metadata_offset": 30, "lag": 0, "last_contact_ms": 200,
                         "last_caught_up_ms": 200}]}


@pytest.fixture
def canned(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Answer DescribeQuorum with QUORUM (this part tests rendering, not the controller)."""
    calls: list[tuple] = []

    def fake(bootstrap, api, body, *_):  # noqa: ANN001, ANN002, ANN202
        calls.append((api, body))
        return QUORUM

    monkeypatch.setattr(common, "call_endpoints", fake)
    return calls


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().out


def test_lag_summaries() -> None:
    assert max_follower_lag(QUORUM) == 2  # voter 1 applied 28, high watermark 31 → 30 is the last
    assert max_follower_lag_time_ms(QUORUM) == 4000  # voter 3, silent for 4 s
    assert max_follower_lag({"leader_id": 1, "voters": [{"node_id": 1, "is_leader": True}]}) is None


def test_status_in_kafkas_shape(capsys: pytest.CaptureFixture, canned: list) -> None:
    code, out = run(capsys, "quorum", "status", *BOOT)
    assert code == 0 and canned == [("DescribeQuorum", {})]
    fields = dict(line.split(":", 1) for line in out.splitlines())
    assert {k: v.strip() for k, v in fields.items()} == {
        "ClusterId": "cid", "LeaderId": "2", "LeaderEpoch": "5", "HighWatermark": "31",
        "CommitIndex": "40", "MaxFollowerLag": "2", "MaxFollowerLagTimeMs": "4000",
        "CurrentVoters": "[1,2,3]", "CurrentObservers": "[101]"}


def test_status_json(capsys: pytest.CaptureFixture, canned: list) -> None:
    code, out = run(capsys, "quorum", "status", *BOOT, "--json")
    assert code == 0
    assert json.loads(out) == {**QUORUM, "leader_epoch": 5, "max_follower_lag": 2,
                               "max_follower_lag_time_ms": 4000, "current_voters": [1, 2, 3],
                               "current_observers": [101]}


def test_replication_table_and_json(capsys: pytest.CaptureFixture, canned: list) -> None:
    code, out = run(capsys, "quorum", "replication", *BOOT)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NODE", "ID", "APPLIED", "OFFSET", "LAG", "LAST", "FETCH", "LAST",
                                "CAUGHT", "UP", "STATUS"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["1"] == ["1", "28", "2", "12", "ms", "ago", "-", "Follower"]
    assert rows["2"] == ["2", "30", "0", "0", "ms", "ago", "0", "ms", "ago", "Leader"]
    assert rows["3"] == ["3", "-", "-", "4000", "ms", "ago", "-", "Follower"]
    assert rows["101"] == ["101", "30", "0", "200", "ms", "ago", "200", "ms", "ago", "Observer"]
    code, out = run(capsys, "quorum", "replication", *BOOT, "--json")
    doc = json.loads(out)
    assert {k: doc[k] for k in ("cluster_id", "leader_id", "term", "high_watermark")} == {
        "cluster_id": "cid", "leader_id": 2, "term": 5, "high_watermark": 31}
    assert doc["replicas"] == replication_rows(QUORUM)
    assert [r["status"] for r in doc["replicas"]] == ["Follower", "Leader", "Follower", "Observer"]


# ---- a real cluster -------------------------------------------------------------------------------

def _replication(cluster: LocalCluster) -> dict:
    return kraft_json("quorum", "replication", "--cluster", str(cluster.dir))


@pytest.mark.integration
def test_replication_on_a_real_cluster(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c").up(3, 2, "--fsync", "never")
    try:
        kraft("topics", "create", "t", "--partitions", "3", "--replication-factor", "2",
              "--cluster", str(cluster.dir))

        def settled() -> dict | None:
            doc = _replication(cluster)
            rows = doc["replicas"]
            ok = (len(rows) == 5 and all(r["lag"] == 0 for r in rows)
                  and all(r["applied_offset"] == doc["high_watermark"] - 1 for r in rows))
            return doc if ok else None

        doc = poll(settled, 60, interval=0.5, what="every voter and broker caught up")
        rows = {r["node_id"]: r for r in doc["replicas"]}
        assert sorted(rows) == [1, 2, 3, 101, 102]
        leader = doc["leader_id"]
        assert [rows[i]["status"] for i in (1, 2, 3)].count("Leader") == 1
        assert rows[leader]["status"] == "Leader"
        assert rows[101]["status"] == rows[102]["status"] == "Observer"
        # the brokers heartbeat every 2 s; the followers answer Raft within a tick
        assert all(0 <= rows[b]["last_fetch_ms_ago"] < 10_000 for b in (101, 102))
        status = kraft_json("quorum", "status", "--cluster", str(cluster.dir))
        assert status["cluster_id"] == cluster.meta["cluster_id"]
        assert status["current_voters"] == [1, 2, 3]
        assert status["current_observers"] == [101, 102]
        assert status["leader_epoch"] == status["term"] >= 1

        cluster.kill(leader)

        def new_leader_sees_all() -> dict | None:
            d = _replication(cluster)
            r = {x["node_id"]: x for x in d["replicas"]}
            ok = (d["leader_id"] not in (-1, leader) and {101, 102} <= set(r)
                  and r[leader]["applied_offset"] is None  # dead: no applied offset to report
                  and all(r[b]["lag"] == 0 for b in (101, 102)))
            return d if ok else None

        after = poll(new_leader_sees_all, 60, interval=0.5, what="a new leader that hears from the brokers")
        rows = {r["node_id"]: r for r in after["replicas"]}
        assert after["high_watermark"] > doc["high_watermark"]  # the new leader's LeaderChange record
        assert rows[after["leader_id"]]["applied_offset"] == after["high_watermark"] - 1
        text = kraft("quorum", "replication", "--cluster", str(cluster.dir)).stdout
        assert text.splitlines()[0].startswith("NODE ID")
        assert sum(" Observer" in line for line in text.splitlines()) == 2
    finally:
        cluster.down()
