"""The simulated brokers' shared replay (tools/sim_broker.py): one decode per batch for all of
them, every copy still checked against what was replayed."""
from __future__ import annotations

import uuid

import pytest

import tools.sim_broker as sim_broker
from kraft.controller.commands import Command
from kraft.controller.settings import ControllerSettings
from kraft.controller.state_machine import QuorumStateMachine
from kraft.image import ReplayError
from kraft.records import RecordDecodeError, batch_hash, decode_batch
from tools.sim_broker import SharedReplay

LISTENER = {"name": "PLAINTEXT", "host": "127.0.0.1", "port": 9092, "security_protocol": "PLAINTEXT"}


def _log(topics: int) -> list[bytes]:
    """Encoded batches of a real state machine: 3 brokers, then ``topics`` topics."""
    sm = QuorumStateMachine(ControllerSettings(cluster_id="c"))
    commands = [("BrokerRegistration", {"broker_id": b, "cluster_id": "c", "incarnation_id": str(uuid.UUID(int=b)),
                                        "listeners": [LISTENER], "rack": None}) for b in (1, 2, 3)]
    commands += [("UnfenceBroker", {"broker_id": b}) for b in (1, 2, 3)]
    commands += [("CreateTopics", {"topics": [{"name": f"t{i}", "num_partitions": 4, "replication_factor": 3}]})
                 for i in range(topics)]
    out = []
    for index, (api, body) in enumerate(commands, start=1):
        if api == "UnfenceBroker":
            body = dict(body, broker_epoch=sm.image.brokers[body["broker_id"]].epoch)
        batch, response = sm.apply(Command(api=api, body=body, request_id=f"r{index}", timestamp_ms=index,
                                           seed=index), index, 1)
        assert batch is not None, response
        out.append(sm.last_encoded)
    return out


def _follow(replay: SharedReplay, batches: list[bytes]) -> list[tuple]:
    """What one broker's verification of its own copies gives, continuing its own offset."""
    answers, offset = [], -1
    for encoded in batches:
        answer = replay.verify(bytes(bytearray(encoded)), offset + 1)  # a copy, as each fetch has
        answers.append(answer)
        offset = answer[1]
    return answers


def test_every_broker_gets_the_answer_of_the_one_decode_and_hash(monkeypatch):
    batches = _log(5)
    replay = SharedReplay()
    decodes, hashes = [], []
    monkeypatch.setattr(sim_broker, "decode_batch", lambda e: decodes.append(e) or decode_batch(e))
    monkeypatch.setattr(sim_broker, "batch_hash", lambda e: hashes.append(e) or batch_hash(e))
    first = _follow(replay, batches)
    assert _follow(replay, batches) == _follow(replay, batches) == first
    assert len(decodes) == len(hashes) == len(batches)  # later copies: compared, not hashed
    expected = []
    for encoded in batches:
        b = decode_batch(encoded)
        expected.append((b.base_offset, b.last_offset, b.prev_hash, batch_hash(encoded)))
    assert first == expected
    assert replay.publish().offset == expected[-1][1]


def test_a_copy_that_differs_from_the_replayed_batch_is_refused():
    batches = _log(2)
    replay = SharedReplay()
    _follow(replay, batches)
    tampered = bytearray(batches[-1])
    tampered[-1] ^= 1  # same offset, other bytes: hashed, and it does not continue the log
    with pytest.raises((ReplayError, RecordDecodeError)):
        replay.verify(bytes(tampered), decode_batch(batches[-1]).base_offset)


def test_batches_older_than_the_recent_ones_kept_are_recognised_by_hash(monkeypatch):
    monkeypatch.setattr(sim_broker, "RECENT_BYTES", 0)  # keep no batch's bytes
    batches = _log(4)
    replay = SharedReplay()
    first = _follow(replay, batches)
    assert _follow(replay, batches) == first  # a late broker: every older copy by hash
    tampered = bytearray(batches[1])
    tampered[-1] ^= 1  # unknown bytes are decoded and replayed, and must continue the log
    with pytest.raises((ReplayError, RecordDecodeError)):
        replay.verify(bytes(tampered), first[1][0])
