"""The apply side of controller v2: committed batches are appended verbatim, a batch that does
not continue the committed log is skipped the same way on every controller, and nothing a
follower applies depends on its local configuration."""

from __future__ import annotations

import uuid

from kraft.controller.commands import Command
from kraft.controller.settings import ControllerSettings
from kraft.controller.state_machine import QuorumStateMachine
from kraft.log.metadata_log import MetadataLog
from kraft.metadata_applier import APPLIED, MetadataApplier
from kraft.snapshotter import Snapshotter

CLUSTER = "the-cluster"


def _applier(directory, cluster_id: str = CLUSTER) -> MetadataApplier:
    log = MetadataLog.open(directory, fsync="never")
    sm = QuorumStateMachine(ControllerSettings(cluster_id))
    return MetadataApplier(sm, log, Snapshotter(directory, log, 1 << 30, 0))


def _propose(leader: QuorumStateMachine, api: str, body: dict, term: int = 1) -> bytes:
    batch, response, _ = leader.propose(
        Command(api, body, request_id=str(uuid.uuid4()), timestamp_ms=1000, seed=7), term
    )
    assert batch is not None, response
    assert leader.last_encoded is not None
    return leader.last_encoded


def _register(broker_id: int) -> dict:
    return {
        "broker_id": broker_id,
        "cluster_id": CLUSTER,
        "incarnation_id": str(uuid.UUID(int=broker_id + 1)),
        "listeners": [],
    }


def _digest(applier: MetadataApplier) -> list[bytes]:
    return [b.encode() for b in applier.log.read_batches(applier.log.start_offset)]


def test_followers_append_the_leaders_batches_whatever_their_own_config(tmp_path):
    """Issue 25: a controller restarted with a mistyped cluster.id forked its log because the
    replicated apply read local config. Followers now only replay what the leader built."""
    leader = QuorumStateMachine(ControllerSettings(CLUSTER))
    entries = [
        [_propose(leader, "ActivateController", {"leader_id": 1, "term": 1})],
        [_propose(leader, "BrokerRegistration", _register(0))],
        [_propose(leader, "BrokerRegistration", _register(1)), _propose(leader, "NoOp", {})],
    ]
    good = _applier(tmp_path / "good")
    typo = _applier(tmp_path / "typo", cluster_id="the-clustr")
    for index, entry in enumerate(entries, start=1):
        assert good.apply_entry(index, 1, entry) == [APPLIED] * len(entry)
        assert typo.apply_entry(index, 1, entry) == [APPLIED] * len(entry)
    assert _digest(good) == _digest(typo) == [raw for entry in entries for raw in entry]
    assert good.state_machine.image.checksum() == leader.image.checksum()
    assert typo.state_machine.image.checksum() == leader.image.checksum()
    assert sorted(typo.state_machine.image.brokers) == [0, 1]


def test_a_deposed_leaders_stale_batches_are_skipped_identically(tmp_path):
    """Leader A proposed P1 then P2 (chained on P1) and was deposed; P1 never committed (its
    group was rejected). New leader B builds Q on the committed image. P2 (too far ahead) and a
    late P1 (behind Q) reach the log around Q: every controller skips both the same way."""
    a = QuorumStateMachine(ControllerSettings(CLUSTER))
    base = [_propose(a, "ActivateController", {"leader_id": 1, "term": 1})]
    b = a.fork()  # the new leader starts from the committed image
    p1 = _propose(a, "BrokerRegistration", _register(0))
    p2 = _propose(a, "BrokerRegistration", _register(1))  # chained on P1
    q = _propose(b, "ActivateController", {"leader_id": 2, "term": 2}, term=2)
    appliers = [_applier(tmp_path / str(i)) for i in range(3)]
    for ap in appliers:
        assert ap.apply_entry(1, 1, base) == [APPLIED]
        results = ap.apply_entry(2, 2, [p2, q, p1])
        assert results[1] is APPLIED
        assert results[0]["error_code"] != 0 and results[2]["error_code"] != 0
    assert [ap.skipped for ap in appliers] == [1, 1, 1]  # P2; P1 is behind the log's end
    digests = [_digest(ap) for ap in appliers]
    assert digests[0] == digests[1] == digests[2] == base + [q]
    assert {ap.state_machine.image.checksum() for ap in appliers} == {b.image.checksum()}


def test_reapplying_the_journal_after_a_restart_appends_nothing_twice(tmp_path):
    """PySyncObj re-applies its journal after a restart: batches the log already has are
    skipped silently, and a tail the log lost (unsynced) is appended again."""
    leader = QuorumStateMachine(ControllerSettings(CLUSTER))
    entries = [
        [_propose(leader, "ActivateController", {"leader_id": 1, "term": 1})],
        [_propose(leader, "BrokerRegistration", _register(0))],
        [_propose(leader, "NoOp", {})],
    ]
    first = _applier(tmp_path / "a")
    for index, entry in enumerate(entries[:2], start=1):
        first.apply_entry(index, 1, entry)
    first.log.close()
    # restart: rebuild the image from the log, then the journal replays every entry
    log = MetadataLog.open(tmp_path / "a", fsync="never")
    sm = QuorumStateMachine(ControllerSettings(CLUSTER))
    for batch in log.read_batches(0):
        sm.replay_batch(batch)
    again = MetadataApplier(sm, log, Snapshotter(tmp_path / "a", log, 1 << 30, 0))
    results = [again.apply_entry(i, 1, e)[0] for i, e in enumerate(entries, start=1)]
    assert results[2] is APPLIED and results[0] is not APPLIED and results[1] is not APPLIED
    assert again.skipped == 0  # "already applied" is not a chain failure
    assert _digest(again) == [raw for entry in entries for raw in entry]
    assert again.state_machine.image.checksum() == leader.image.checksum()


def test_an_entry_that_is_not_a_batch_is_skipped_without_stopping(tmp_path):
    """A pre-v2 command group left in the journal does not decode as a batch: skipped alike."""
    ap = _applier(tmp_path)
    (result,) = ap.apply_entry(1, 1, [b"\x88\xa3api\xa4NoOp"])
    assert result["error_code"] != 0 and ap.fatal_error is None
    assert ap.log.next_offset == 0
