"""Unit tests for the chaos history checker (tests/chaos/history.py): each check passes on a
correct history and names the anomaly on a broken one. Logs are built with the real state machine."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from kraft.controller.commands import Command
from kraft.controller.settings import ControllerSettings
from kraft.controller.state_machine import QuorumStateMachine
from kraft.records import Batch, PartitionChangeRecord, Provenance
from tests.chaos.history import (
    FAIL,
    INFO,
    OK,
    FaultWindow,
    History,
    check_availability,
    check_images,
    check_leader_epochs,
    check_logs_identical,
    check_operations,
    check_raft_terms,
    leader_reports,
    scan_log,
    unexplained_fences,
)
from tests.chaos.workload import request


class Log:
    """A metadata log written by the real state machine, with request ids we choose."""

    def __init__(self) -> None:
        self.sm = QuorumStateMachine(ControllerSettings(cluster_id="c1"))
        self.batches: list[Batch] = []
        self.index = itertools.count(1)
        self.write("ActivateController", {"leader_id": 1, "term": 1}, "activate-1-1")
        for b in (101, 102):
            self.write(
                "BrokerRegistration",
                {
                    "broker_id": b,
                    "cluster_id": "c1",
                    "incarnation_id": f"00000000-0000-4000-8000-{b:012d}",
                    "listeners": [
                        {
                            "name": "PLAINTEXT",
                            "host": "h",
                            "port": 9000 + b,
                            "security_protocol": "PLAINTEXT",
                        }
                    ],
                    "rack": None,
                    "features": [{"name": "metadata.version", "min_version": 1, "max_version": 2}],
                },
                f"reg-{b}",
            )
            epoch = self.sm.image.brokers[b].epoch
            self.write("UnfenceBroker", {"broker_id": b, "broker_epoch": epoch}, f"unfence-{b}")

    def write(
        self, api: str, body: dict, request_id: str, term: int = 1, at_ms: int = 1000
    ) -> dict:
        cmd = Command(
            api=api,
            body=body,
            request_id=request_id,
            principal="test",
            client_id="t",
            timestamp_ms=at_ms,
            seed=7,
            leader_id=1,
        )
        next(self.index)
        batch, response, _ = self.sm.propose(cmd, term)
        if batch is not None:
            self.batches.append(batch)
        return response

    def op(
        self, history: History, kind: str, topic: str, args: dict, outcome: str, apply: bool = True
    ) -> None:
        rid = f"{kind}-{topic}-{len(history.ops)}"
        op = history.invoke(kind, topic, rid, args, float(len(history.ops)))
        if apply:
            self.write(*request(kind, topic, args), rid)
        history.complete(op, outcome, op.invoke_s + 0.5)


CREATE = {"partitions": 2, "replication_factor": 1}


def test_correct_history_has_no_anomalies() -> None:
    log, h = Log(), History()
    log.op(h, "create", "a", CREATE, OK)
    log.op(h, "partitions", "a", {"count": 4}, OK)
    log.op(h, "config", "a", {"key": "retention.ms", "value": "123456"}, OK)
    log.op(h, "create", "b", CREATE, OK)
    log.op(h, "delete", "b", {}, OK)
    log.op(h, "create", "c", CREATE, INFO)  # timed out but applied: allowed
    log.op(h, "create", "d", CREATE, INFO, apply=False)  # timed out, never applied: allowed
    log.op(h, "create", "e", CREATE, FAIL, apply=False)
    facts = scan_log(log.batches)
    assert check_operations(h.ops, facts) == []
    assert h.counts() == {OK: 5, FAIL: 1, INFO: 2}
    assert facts.final.topic("a") is not None and len(facts.final.topic("a").partitions) == 4


def test_acknowledged_but_lost_write_is_found() -> None:
    log, h = Log(), History()
    log.op(h, "create", "a", CREATE, OK, apply=False)
    kinds = {a.kind for a in check_operations(h.ops, scan_log(log.batches))}
    assert kinds == {"applied-count", "lost-write"}


def test_applied_twice_is_found() -> None:
    log, h = Log(), History()
    log.op(h, "create", "a", CREATE, OK)
    rid = h.ops[0].request_id
    log.write("CreatePartitions", {"topics": [{"name": "a", "count": 3}]}, "other")
    log.batches[-1] = dataclasses.replace(log.batches[-1], provenance=Provenance(request_id=rid))
    assert any(
        a.kind == "applied-count" and "2 batch" in a.detail
        for a in check_operations(h.ops, scan_log(log.batches))
    )


def test_failed_write_that_was_applied_is_found() -> None:
    log, h = Log(), History()
    log.op(h, "create", "a", CREATE, FAIL)
    kinds = {a.kind for a in check_operations(h.ops, scan_log(log.batches))}
    assert kinds == {"applied-count", "resurrected-topic"}


def test_phantom_topic_is_found() -> None:
    log, h = Log(), History()
    log.write(*request("create", "ghost", CREATE), "nobody")
    assert [a.kind for a in check_operations(h.ops, scan_log(log.batches))] == ["phantom-topic"]


def test_wrong_partition_count_and_config_are_found() -> None:
    log, h = Log(), History()
    log.op(h, "create", "a", CREATE, OK)
    log.op(h, "partitions", "a", {"count": 5}, OK, apply=False)
    log.op(h, "config", "a", {"key": "retention.ms", "value": "99999"}, OK, apply=False)
    kinds = sorted(a.kind for a in check_operations(h.ops, scan_log(log.batches)))
    assert kinds == ["applied-count", "applied-count", "config-value", "partition-count"]


def test_indeterminate_later_op_widens_what_is_allowed() -> None:
    log, h = Log(), History()
    log.op(h, "create", "a", CREATE, OK)
    log.op(h, "delete", "a", {}, INFO, apply=False)
    log.op(h, "config", "a", {"key": "retention.ms", "value": "5000"}, INFO, apply=False)
    assert check_operations(h.ops, scan_log(log.batches)) == []


def test_logs_identical() -> None:
    assert check_logs_identical({1: (10, "ab"), 2: (10, "ab"), 3: (10, "ab")}) == []
    [a] = check_logs_identical({1: (10, "ab"), 2: (10, "ab"), 3: (9, "cd")})
    assert a.kind == "log-divergence" and "controller 3" in a.detail


def test_images_compared_at_the_same_offset() -> None:
    log, h = Log(), History()
    log.op(h, "create", "a", CREATE, OK)
    mid = log.batches[-1].last_offset
    log.op(h, "create", "b", CREATE, OK)
    end = log.batches[-1].last_offset
    facts = scan_log(log.batches, checksum_at={mid, end})
    good = {101: (mid, facts.checksums[mid]), 1: (end, facts.final.checksum())}
    assert check_images(good, facts) == []
    bad = {101: (end, facts.checksums[mid]), 102: (end + 5, "x")}
    assert sorted(a.kind for a in check_images(bad, facts)) == ["image-checksum", "image-offset"]


def test_leader_epochs_from_a_real_log() -> None:
    log, h = Log(), History()
    log.op(h, "create", "a", {"partitions": 1, "replication_factor": 2}, OK)
    log.write("ElectLeaders", {"election_type": "preferred", "partitions": None}, "e1")
    facts = scan_log(log.batches)
    assert facts.leader_epochs and check_leader_epochs(facts.leader_epochs) == []
    tid, pid, epoch, leader = facts.leader_epochs[-1]
    assert check_leader_epochs(facts.leader_epochs, [(tid, pid, epoch, leader)]) == []


def test_two_leaders_in_one_epoch_and_regression_are_found() -> None:
    events = [("t", 0, 0, 101), ("t", 0, 1, 102), ("t", 0, 0, 101)]
    assert [a.kind for a in check_leader_epochs(events)] == ["leader-epoch-regressed"]
    [a] = check_leader_epochs(events[:2], observed=[("t", 0, 1, 101)])
    assert a.kind == "two-leaders-one-epoch" and "epoch 1" in a.detail


def test_partition_change_epochs_tracked_per_record() -> None:
    log, h = Log(), History()
    log.op(h, "create", "a", {"partitions": 1, "replication_factor": 2}, OK)
    tid = log.sm.image.topic("a").topic_id
    reg = log.sm.image.partition(tid, 0)
    other = next(r for r in reg.replicas if r != reg.leader)
    change = PartitionChangeRecord(
        partition_id=0,
        topic_id=tid,
        isr=None,
        leader=other,
        replicas=None,
        removing_replicas=None,
        adding_replicas=None,
        leader_recovery_state=-1,
        election="clean",
    )
    last = log.batches[-1]
    extra = Batch(
        base_offset=last.next_offset,
        term=1,
        raft_index=99,
        timestamp_ms=last.timestamp_ms,
        provenance=Provenance(request_id="x"),
        prev_hash=log.sm.image.last_hash,
        records=(change,),
    )
    facts = scan_log(log.batches + [extra])
    assert facts.leader_epochs[-1] == (tid, 0, reg.leader_epoch + 1, other)


def test_raft_terms() -> None:
    assert check_raft_terms([(1, 1), (2, 3), (5, 2)], [(2, 3), (6, 1)]) == []
    [a] = check_raft_terms([(1, 1), (2, 3)], [(2, 1)])
    assert a.kind == "two-leaders-one-term" and "term 2" in a.detail


def test_leader_reports_parse_controller_logs() -> None:
    text = (
        "2026-11-22 11:13:03,476 INFO kraft.quorum.raft: raft member 3: leader in term 105\n"
        "2026-11-22 11:13:03,493 INFO kraft.quorum.raft: raft member 2: not leader in term 106\n"
        "2026-11-22 11:13:03,553 INFO kraft.quorum.raft: raft member 2: leader in term 106\n"
    )
    assert leader_reports(text) == [(105, 3), (106, 2)]
    assert check_raft_terms([(106, 2)], leader_reports(text)) == []


def test_history_rejects_unknown_kinds_and_outcomes() -> None:
    h = History()
    with pytest.raises(ValueError):
        h.invoke("rename", "a", "r", {}, 0.0)
    op = h.invoke("create", "a", "r", CREATE, 0.0)
    with pytest.raises(ValueError):
        h.complete(op, "maybe", 1.0)


def _fence_both_then_unfence() -> Log:
    """Brokers 101 and 102 lead one single-replica partition each; 101 is fenced at 5 s, 102 at
    6 s (both by session timeout), both unfenced again at 20 s."""
    log = Log()
    log.write(*request("create", "a", {"partitions": 2, "replication_factor": 1}), "c-a")
    for b, at in ((101, 5000), (102, 6000)):
        epoch = log.sm.image.brokers[b].epoch
        body = {"broker_id": b, "broker_epoch": epoch, "reason": "session-timeout"}
        log.write("FenceBroker", body, f"fence-{b}", at_ms=at)
    for b in (101, 102):
        epoch = log.sm.image.brokers[b].epoch
        log.write("UnfenceBroker", {"broker_id": b, "broker_epoch": epoch}, f"u-{b}", at_ms=20000)
    return log


def test_outages_and_fences_from_the_log() -> None:
    facts = scan_log(_fence_both_then_unfence().batches)
    whole = [(o.what, o.start_ms, o.end_ms, sorted(o.nodes)) for o in facts.outages]
    assert ("all-fenced", 6000, 20000, [101, 102]) in whole
    leaderless = [w[1:] for w in whole if w[0] == "leaderless"]
    assert leaderless == [(5000, 20000, [101]), (6000, 20000, [102])]  # in order of start
    assert [(ms, b) for ms, b, _ in facts.fences if ms >= 5000] == [(5000, 101), (6000, 102)]
    assert unexplained_fences(facts.fences, [], (0, 30000)) == [
        (5000, 101, "session-timeout"),
        (6000, 102, "session-timeout"),
    ]


def test_availability_rule_names_unexplained_outages() -> None:
    outages = scan_log(_fence_both_then_unfence().batches).outages
    kinds = [a.kind for a in check_availability(outages, [], (0, 30000), 4000)]
    assert sorted(kinds) == ["all-brokers-fenced", "leaderless-partition", "leaderless-partition"]
    # a fault on broker 101 explains its partition, not 102's nor everyone fenced
    pause_101 = FaultWindow("pause-broker", frozenset({101}), 4000, 12000)
    kinds = [a.kind for a in check_availability(outages, [pause_101], (0, 30000), 4000)]
    assert sorted(kinds) == ["all-brokers-fenced", "leaderless-partition"]
    # a fault that took the controller majority away explains everything it overlaps
    no_quorum = FaultWindow("kill-in-election", frozenset({1, 2}), 4000, 7000, quorum_lost=True)
    assert check_availability(outages, [no_quorum], (0, 30000), 4000) == []
    # outside the window (e.g. the final controlled shutdowns) nothing counts
    assert check_availability(outages, [], (21000, 30000), 4000) == []
    # leaderless for less than the limit is allowed; everyone fenced never is
    kinds = [a.kind for a in check_availability(outages, [], (0, 30000), 60000)]
    assert kinds == ["all-brokers-fenced"]


def test_correct_history_has_no_outage() -> None:
    log = Log()
    log.write(*request("create", "a", {"partitions": 2, "replication_factor": 2}), "c-a")
    facts = scan_log(log.batches)
    assert facts.outages == []
    assert check_availability(facts.outages, [], (0, 10**13), 0) == []
