"""The active controller's in-flight proposals: a commit retires every proposal before it, and
a rebuild of the speculative state never replays a proposal the committed state already holds
(one whose writer timed out before it committed) nor one that no longer continues it."""

from __future__ import annotations

import uuid

from kraft.controller.commands import Command
from kraft.controller.in_flight import InFlightProposals
from kraft.controller.settings import ControllerSettings
from kraft.controller.state_machine import QuorumStateMachine
from tests.unit.test_metadata_applier import CLUSTER, _register


def _propose(sm: QuorumStateMachine, api: str, body: dict, term: int = 1) -> tuple[bytes, object]:
    batch, response, _ = sm.propose(
        Command(api, body, request_id=str(uuid.uuid4()), timestamp_ms=1000, seed=7), term
    )
    assert batch is not None, response
    assert sm.last_encoded is not None
    return sm.last_encoded, batch


def _chain(committed: QuorumStateMachine, n: int) -> tuple[InFlightProposals, list, object]:
    """``n`` proposals on a fork of ``committed``, all in flight; (chain, [(raw, batch)], spec)."""
    spec = committed.fork()
    chain = InFlightProposals()
    made = [_propose(spec, "BrokerRegistration", _register(i)) for i in range(n)]
    for raw, batch in made:
        chain.add(raw, batch)
    return chain, made, spec


def _committed() -> QuorumStateMachine:
    sm = QuorumStateMachine(ControllerSettings(CLUSTER))
    raw, batch = _propose(sm.fork(), "ActivateController", {"leader_id": 1, "term": 1})
    sm.replay_batch(batch, raw)
    return sm


def test_a_commit_retires_it_and_every_proposal_before_it() -> None:
    committed = _committed()
    chain, made, _ = _chain(committed, 3)
    chain.committed(made[1][0])  # the first one's writer timed out: it was never reported
    assert made[0][0] not in chain and made[1][0] not in chain
    assert made[2][0] in chain and len(chain) == 1


def test_a_rebuild_does_not_replay_what_already_committed() -> None:
    committed = _committed()
    chain, made, spec = _chain(committed, 3)
    (a_raw, a), (b_raw, b), (c_raw, _) = made
    committed.replay_batch(a, a_raw)  # A committed; its writer had stopped waiting
    rebuilt = chain.rebuild(committed, c_raw)  # C was refused before it reached Raft
    assert len(chain) == 1 and b_raw in chain
    reference = committed.fork()
    reference.replay_batch(b, b_raw)
    assert rebuilt.image.offset == reference.image.offset == committed.image.offset + 1
    assert rebuilt.image.checksum() == reference.image.checksum()
    assert sorted(rebuilt.image.brokers) == [0, 1]


def test_a_rebuild_stops_at_the_first_proposal_that_does_not_continue_the_log() -> None:
    committed = _committed()
    chain, made, _ = _chain(committed, 3)
    other = committed.fork()  # another leader's batch took the offset of our first one
    q_raw, q = _propose(other, "BrokerRegistration", _register(7), term=2)
    committed.replay_batch(q, q_raw)
    rebuilt = chain.rebuild(committed, made[2][0])
    assert len(chain) == 0
    assert rebuilt.image.checksum() == committed.image.checksum()
    assert sorted(rebuilt.image.brokers) == [7]


def test_a_rebuild_without_a_failed_proposal_keeps_none() -> None:
    committed = _committed()
    chain, made, _ = _chain(committed, 2)
    rebuilt = chain.rebuild(committed, b"")
    assert len(chain) == 0 and rebuilt.image.offset == committed.image.offset
