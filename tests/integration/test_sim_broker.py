"""The simulated brokers' shared replay (testsupport/sim_broker.py): one decode per batch for all of
them, every copy still checked against what was replayed."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import testsupport.sim_broker as sim_broker
from kraft.controller.commands import Command
from kraft.controller.settings import ControllerSettings
from kraft.controller.state_machine import QuorumStateMachine
from kraft.metadata.delta import ReplayError
from kraft.records import RecordDecodeError, batch_hash, decode_batch
from kraft.snapshotter import image_from_snapshot as sim_broker_image_from_snapshot
from testsupport.sim_broker import SharedReplay

LISTENER = {
    "name": "PLAINTEXT",
    "host": "127.0.0.1",
    "port": 9092,
    "security_protocol": "PLAINTEXT",
}


def _log(topics: int) -> list[bytes]:
    """Encoded batches of a real state machine: 3 brokers, then ``topics`` topics."""
    sm = QuorumStateMachine(ControllerSettings(cluster_id="c"))
    commands = [
        (
            "BrokerRegistration",
            {
                "broker_id": b,
                "cluster_id": "c",
                "incarnation_id": str(uuid.UUID(int=b)),
                "listeners": [LISTENER],
                "rack": None,
            },
        )
        for b in (1, 2, 3)
    ]
    commands += [("UnfenceBroker", {"broker_id": b}) for b in (1, 2, 3)]
    commands += [
        (
            "CreateTopics",
            {"topics": [{"name": f"t{i}", "num_partitions": 4, "replication_factor": 3}]},
        )
        for i in range(topics)
    ]
    out = []
    for index, (api, body) in enumerate(commands, start=1):
        if api == "UnfenceBroker":
            body = dict(body, broker_epoch=sm.image.brokers[body["broker_id"]].epoch)
        batch, response, _ = sm.propose(
            Command(api=api, body=body, request_id=f"r{index}", timestamp_ms=index, seed=index),
            1,
        )
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


@pytest.mark.integration
def test_simulated_brokers_told_to_load_a_snapshot_load_it_once_and_converge(tmp_path, monkeypatch):
    """Brokers far behind the newest snapshot are told to load it: the first simulated broker
    of the process fetches and loads it into the shared replay, the next one needs only its
    header; both follow the log from there and end on the controller's image."""
    import trio

    from kraft.log.snapshot import parse_snapshot_name
    from kraft.rpc.client import ControllerClient, call_sync
    from tests.harness import LocalCluster, poll
    from testsupport.sim_broker import SimBroker, wait_unfenced

    c = LocalCluster(tmp_path / "cluster")
    try:
        c.up(1, 0)
        c.kill(1, "TERM")
        props = Path(c.controller(1)["config"])
        props.write_text(
            props.read_text() + "\nmetadata.log.max.record.bytes.between.snapshots=4096\n"
            "metadata.fetch.snapshot.min.lag.records=20\n"
        )
        c.start(1)
        bootstrap = [(c.controller(1)["host"], c.controller(1)["rpc_port"])]
        for i in range(40):
            r = call_sync(
                bootstrap,
                "IncrementalAlterConfigs",
                {
                    "resources": [
                        {
                            "resource_type": "broker",
                            "resource_name": "",
                            "ops": [
                                {"name": "log.retention.ms", "op": "SET", "value": str(1000 + i)}
                            ],
                        }
                    ]
                },
                timeout=30,
                credentials=c.credentials(),
            )
            assert not r["resources"][0]["error_code"], r

        def snapshot_ends() -> list[int]:  # without list_snapshots: it would remove a .part in use
            ends = []
            for p in Path(c.log_dir(1)).iterdir():
                try:
                    ends.append(parse_snapshot_name(p)[0])
                except ValueError:
                    continue
            return ends

        # one far enough ahead of offset 0 that a broker starting there is told to load it (on a
        # slow machine the first snapshot can come after only a few of the 40 changes)
        poll(
            lambda: any(end >= 30 for end in snapshot_ends()), 60, what="a snapshot past offset 30"
        )
        replay = SharedReplay()
        sims = [
            SimBroker(
                101 + i,
                bootstrap,
                c.meta["cluster_id"],
                replay=replay,
                credentials=c.credentials("broker"),
            )
            for i in range(2)
        ]
        loads = []
        monkeypatch.setattr(
            sim_broker,
            "image_from_snapshot",
            lambda path: loads.append(path) or sim_broker_image_from_snapshot(path),
        )

        compared = []

        async def run() -> None:
            client = ControllerClient(bootstrap, credentials=c.credentials())
            async with trio.open_nursery() as nursery:
                for sim in sims:
                    await nursery.start(sim.run)
                await wait_unfenced(sims, 60)
                with trio.fail_after(60):
                    while not compared:  # the controller's image at an offset both sims replayed
                        node = await client.call("DescribeNode", {"checksum": True}, timeout=30)
                        while min(s.metadata_offset for s in sims) < node["applied_offset"]:
                            await trio.sleep(0.05)
                        image = replay.publish()
                        if image.offset == node["applied_offset"]:
                            compared.append((image.checksum(), node["image_checksum"]))
                nursery.cancel_scope.cancel()
            await client.aclose()

        trio.run(run)
        assert len(loads) == 1
        assert compared[0][0] == compared[0][1]
    finally:
        c.down()
