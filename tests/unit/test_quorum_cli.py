"""``kraft quorum status|replication``: Kafka-shaped rendering of a canned DescribeQuorum response
(the real cluster side is in test_metrics.py)."""

from __future__ import annotations

import json

import pytest

from tools import cli
from tools.commands import common
from tools.commands.quorum import max_follower_lag, max_follower_lag_time_ms, replication_rows

BOOT = ["--bootstrap-controller", "127.0.0.1:9093"]

QUORUM = {
    "cluster_id": "cid",
    "leader_id": 2,
    "term": 5,
    "commit_index": 40,
    "high_watermark": 31,
    "voters": [
        {
            "node_id": 1,
            "host": "127.0.0.1",
            "port": 9001,
            "applied_offset": 28,
            "lag": 3,
            "last_contact_ms": 12,
            "last_caught_up_ms": None,
            "is_leader": False,
        },
        {
            "node_id": 2,
            "host": "127.0.0.1",
            "port": 9002,
            "applied_offset": 30,
            "lag": 0,
            "last_contact_ms": 0,
            "last_caught_up_ms": 0,
            "is_leader": True,
        },
        {
            "node_id": 3,
            "host": "127.0.0.1",
            "port": 9003,
            "applied_offset": None,
            "lag": None,
            "last_contact_ms": 4000,
            "last_caught_up_ms": None,
            "is_leader": False,
        },
    ],
    "observers": [
        {
            "broker_id": 101,
            "metadata_offset": 30,
            "lag": 0,
            "last_contact_ms": 200,
            "last_caught_up_ms": 200,
        }
    ],
}


@pytest.fixture
def canned(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Answer DescribeQuorum with QUORUM (this part tests rendering, not the controller)."""
    calls: list[tuple] = []

    def fake(bootstrap, api, body, *_):
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
        "ClusterId": "cid",
        "LeaderId": "2",
        "LeaderEpoch": "5",
        "HighWatermark": "31",
        "CommitIndex": "40",
        "MaxFollowerLag": "2",
        "MaxFollowerLagTimeMs": "4000",
        "CurrentVoters": "[1,2,3]",
        "CurrentObservers": "[101]",
        "DivergentVoters": "[]",
    }


def test_status_json(capsys: pytest.CaptureFixture, canned: list) -> None:
    code, out = run(capsys, "quorum", "status", *BOOT, "--json")
    assert code == 0
    assert json.loads(out) == {
        **QUORUM,
        "leader_epoch": 5,
        "max_follower_lag": 2,
        "max_follower_lag_time_ms": 4000,
        "current_voters": [1, 2, 3],
        "current_observers": [101],
        "divergent_voters": [],
    }


def test_replication_table_and_json(capsys: pytest.CaptureFixture, canned: list) -> None:
    code, out = run(capsys, "quorum", "replication", *BOOT)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "NODE",
        "ID",
        "APPLIED",
        "OFFSET",
        "LAG",
        "LAST",
        "FETCH",
        "LAST",
        "CAUGHT",
        "UP",
        "STATUS",
        "DIVERGENT",
    ]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["1"] == ["1", "28", "2", "12", "ms", "ago", "-", "Follower", "-"]
    assert rows["2"] == ["2", "30", "0", "0", "ms", "ago", "0", "ms", "ago", "Leader", "-"]
    assert rows["3"] == ["3", "-", "-", "4000", "ms", "ago", "-", "Follower", "-"]
    assert rows["101"] == [
        "101",
        "30",
        "0",
        "200",
        "ms",
        "ago",
        "200",
        "ms",
        "ago",
        "Observer",
        "-",
    ]
    code, out = run(capsys, "quorum", "replication", *BOOT, "--json")
    doc = json.loads(out)
    assert {k: doc[k] for k in ("cluster_id", "leader_id", "term", "high_watermark")} == {
        "cluster_id": "cid",
        "leader_id": 2,
        "term": 5,
        "high_watermark": 31,
    }
    assert doc["replicas"] == replication_rows(QUORUM)
    assert [r["status"] for r in doc["replicas"]] == ["Follower", "Leader", "Follower", "Observer"]


# The replication view of a real cluster (3 voters, brokers as observers, across a failover) is
# checked in test_metrics.py, on the same cluster as the metrics endpoints.


def test_a_divergent_voter_is_named_with_its_offset(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    voters = [dict(v) for v in QUORUM["voters"]]
    voters[0]["log_head"] = {"offset": 28, "hash": "ab" * 32}
    voters[0]["divergent_from_offset"] = 17
    voters[1]["log_head"] = {"offset": 30, "hash": "cd" * 32}
    diverged = {**QUORUM, "voters": voters, "divergent_voters": [1]}
    monkeypatch.setattr(common, "call_endpoints", lambda *_: diverged)
    code, out = run(capsys, "quorum", "status", *BOOT)
    assert code == 0
    assert dict(line.split(":", 1) for line in out.splitlines())["DivergentVoters"].strip() == "[1]"
    code, out = run(capsys, "quorum", "replication", *BOOT)
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert rows["1"][-4:] == ["Follower", "from", "offset", "17"]
    assert rows["2"][-2:] == ["Leader", "-"]
    code, out = run(capsys, "quorum", "replication", *BOOT, "--json")
    first = json.loads(out)["replicas"][0]
    assert first["divergent_from_offset"] == 17
    assert (first["log_head_offset"], first["log_head_hash"]) == (28, "ab" * 32)
