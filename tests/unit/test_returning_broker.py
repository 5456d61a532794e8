"""A broker's next process with its disks' proof (``previous_broker_epoch``) replaces its
registration once the old session expires, instead of being fenced first: the session timer
leaves its expired session unfenced while it keeps asking, and fences it after all when it
stops. On the real state machine through ``StateMachineServer``, with a short session."""

from __future__ import annotations

import uuid

import pytest
import trio

from kraft import broker_lifecycle
from kraft.broker_lifecycle import BrokerLifecycle
from kraft.controller.settings import ControllerSettings
from kraft.errors import ErrorCode, KraftError
from kraft.rpc.bodies import BrokerRegistrationRequest
from testsupport.state_machine_server import FEATURES, LISTENER, StateMachineServer

SESSION_MS = 300


def body(broker: int, incarnation: int, previous: int = -1) -> dict:
    return {
        "broker_id": broker,
        "cluster_id": "c",
        "incarnation_id": str(uuid.UUID(int=incarnation)),
        "listeners": [LISTENER],
        "rack": None,
        "features": FEATURES,
        "previous_broker_epoch": previous,
    }


async def register(lifecycle: BrokerLifecycle, wire: dict) -> dict:
    req = BrokerRegistrationRequest(
        **{k: v for k, v in wire.items() if k != "listeners"}, listeners=[]
    )
    return await lifecycle.register(req, wire, None)


async def two_brokers_leading() -> tuple[StateMachineServer, BrokerLifecycle]:
    server = StateMachineServer(ControllerSettings(cluster_id="c"))
    await server.submit("ActivateController", {"leader_id": 1, "term": 1})
    lifecycle = BrokerLifecycle(server, SESSION_MS)  # type: ignore[arg-type]  # a stand-in
    for b in (1, 2):
        await register(lifecycle, body(b, b))
        epoch = server.image().brokers[b].epoch
        await server.submit("UnfenceBroker", {"broker_id": b, "broker_epoch": epoch})
    await server.submit(
        "CreateTopics", {"topics": [{"name": "t", "assignments": {0: [1, 2], 1: [2, 1]}}]}
    )
    return server, lifecycle


def partitions(server: StateMachineServer) -> dict:
    topic = server.image().topic("t")
    return {pid: (p.leader, p.isr, p.leader_epoch) for pid, p in topic.partitions.items()}


async def until(condition, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.01)


async def timer_until_fenced(lifecycle: BrokerLifecycle, server: StateMachineServer) -> None:
    """Run the session timer (broker 2 kept alive) until broker 1 is fenced."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lifecycle.session_timer_loop)

        def fenced() -> bool:
            lifecycle.heartbeats.touch(2, broker_lifecycle.now_ms())
            return bool(server.image().brokers[1].fenced)

        await until(fenced)
        nursery.cancel_scope.cancel()


@pytest.fixture
def short_grace(monkeypatch):
    monkeypatch.setattr(broker_lifecycle, "RETURNING_GRACE_S", 0.5)


def test_a_returning_broker_replaces_its_registration_and_keeps_its_partitions(short_grace):
    async def main() -> None:
        server, lifecycle = await two_brokers_leading()
        before = partitions(server)
        old_epoch = server.image().brokers[1].epoch
        returning = body(1, 11, previous=old_epoch)
        with pytest.raises(KraftError) as refused:  # the old session still lives
            await register(lifecycle, returning)
        assert refused.value.code == ErrorCode.DUPLICATE_BROKER_REGISTRATION
        assert 1 in lifecycle.returning
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lifecycle.session_timer_loop)

            def keep_broker_2_alive() -> bool:
                lifecycle.heartbeats.touch(2, broker_lifecycle.now_ms())
                return 1 in lifecycle.deferred_fences

            await until(keep_broker_2_alive)  # expired, but left unfenced: it is coming back
            result = await register(lifecycle, returning)
            nursery.cancel_scope.cancel()
        reg = server.image().brokers[1]
        assert result["broker_epoch"] == reg.epoch > old_epoch and reg.fenced
        assert partitions(server) == before  # nothing moved, no leader epoch bumped
        assert not [c for c in server.commands if c["api"] == "FenceBroker"]
        assert lifecycle.returning == {} and lifecycle.deferred_fences == {}

    trio.run(main)


def test_a_returning_broker_that_stops_asking_is_fenced_after_all(short_grace):
    async def main() -> None:
        server, lifecycle = await two_brokers_leading()
        with pytest.raises(KraftError):
            await register(lifecycle, body(1, 11, previous=server.image().brokers[1].epoch))
        await timer_until_fenced(lifecycle, server)
        assert all(leader == 2 for leader, _, _ in partitions(server).values())
        assert lifecycle.deferred_fences == {}

    trio.run(main)


def test_without_the_proof_the_expired_broker_is_fenced_first():
    async def main() -> None:
        server, lifecycle = await two_brokers_leading()
        for previous in (-1, server.image().brokers[1].epoch - 1):  # a wiped disk, an old one
            with pytest.raises(KraftError):
                await register(lifecycle, body(1, 11, previous=previous))
        assert lifecycle.returning == {}
        await timer_until_fenced(lifecycle, server)
        assert all(leader == 2 and isr == (2,) for leader, isr, _ in partitions(server).values())
        result = await register(lifecycle, body(1, 11))
        assert result["broker_epoch"] == server.image().brokers[1].epoch

    trio.run(main)
