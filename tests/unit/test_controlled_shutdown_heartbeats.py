"""A broker's controlled shutdown is written in the background while its heartbeats are
answered: at 2M partitions its steps outlast a heartbeat's RPC timeout, and a broker that gave
up on its heartbeat stopped heartbeating until its session expired (``BrokerLifecycle.run``).

The write path is the real state machine's ``propose`` (testsupport.state_machine_server)."""

from __future__ import annotations

import trio

from kraft.broker_lifecycle import BrokerLifecycle
from kraft.controller.settings import ControllerSettings
from kraft.rpc.bodies import BrokerHeartbeatRequest, BrokerHeartbeatResponse
from testsupport.state_machine_server import StateMachineServer, activate_with_brokers


async def heartbeat(
    lifecycle: BrokerLifecycle, server: StateMachineServer, broker: int, shutdown: bool = False
) -> BrokerHeartbeatResponse:
    req = BrokerHeartbeatRequest(
        broker_id=broker,
        broker_epoch=server.image().brokers[broker].epoch,
        metadata_offset=server.image().offset,
        want_fence=False,
        want_shutdown=shutdown,
    )
    return await lifecycle.heartbeat(req, {}, None)


def led_by(server: StateMachineServer, broker: int) -> int:
    return sum(
        p.leader == broker
        for t in server.image().topics_by_id.values()
        for p in t.partitions.values()
    )


async def cluster() -> tuple[StateMachineServer, BrokerLifecycle]:
    """3 unfenced brokers and 40 partitions RF 3; steps of 4 records, so a broker's controlled
    shutdown takes several."""
    server = StateMachineServer(ControllerSettings(cluster_id="c", transition_step_records=4))
    await activate_with_brokers(server, (1, 2, 3))
    lifecycle = BrokerLifecycle(server, 9000)  # type: ignore[arg-type]  # see StateMachineServer
    lifecycle.reset()
    for b in (1, 2, 3):
        await server.submit(
            "UnfenceBroker", {"broker_id": b, "broker_epoch": server.image().brokers[b].epoch}
        )
    await server.submit(
        "CreateTopics", {"topics": [{"name": "t", "num_partitions": 40, "replication_factor": 3}]}
    )
    return server, lifecycle


def test_heartbeats_are_answered_while_the_shutdown_is_written():
    async def main() -> None:
        server, lifecycle = await cluster()
        assert led_by(server, 1) > 4  # more than one step's worth
        server.hold = trio.Event()  # the steps after the first wait
        async with trio.open_nursery() as nursery:
            await nursery.start(lifecycle.run)
            with trio.fail_after(5):
                first = await heartbeat(lifecycle, server, 1, shutdown=True)
            assert not first.should_shut_down and not first.is_fenced
            assert lifecycle.shutting_down == {1}
            with trio.fail_after(5):
                while not server.image().brokers[1].in_controlled_shutdown:
                    await trio.sleep(0.01)
            written = len(server.commands)
            assert led_by(server, 1) > 0  # held after its first step
            for _ in range(3):  # polls meanwhile: answered, nothing written for them
                with trio.fail_after(5):
                    again = await heartbeat(lifecycle, server, 1, shutdown=True)
                assert not again.should_shut_down and not again.is_fenced
                # and each one's progress is recorded, as a full heartbeat's would be
                assert lifecycle.heartbeats.metadata_offset(1) == server.image().offset
            assert len(server.commands) == written
            server.hold.set()
            with trio.fail_after(5):
                while lifecycle.shutting_down:
                    await trio.sleep(0.01)
            assert led_by(server, 1) == 0
            # the others report the shutdown's last offset; then it may shut down
            await heartbeat(lifecycle, server, 2)
            await heartbeat(lifecycle, server, 3)
            last = await heartbeat(lifecycle, server, 1, shutdown=True)
            assert last.should_shut_down
            assert server.image().brokers[1].fenced
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_without_the_background_nursery_the_heartbeat_writes_it_first():
    async def main() -> None:
        server, lifecycle = await cluster()
        await heartbeat(lifecycle, server, 2)
        await heartbeat(lifecycle, server, 3)
        first = await heartbeat(lifecycle, server, 1, shutdown=True)
        assert lifecycle.shutting_down == set()
        assert led_by(server, 1) == 0  # every step written before the answer
        # the others had reported no offset of the shutdown yet: not this time
        assert not first.should_shut_down and not server.image().brokers[1].fenced
        await heartbeat(lifecycle, server, 2)
        await heartbeat(lifecycle, server, 3)
        last = await heartbeat(lifecycle, server, 1, shutdown=True)
        assert last.should_shut_down
        assert server.image().brokers[1].fenced  # fenced before it was told to go

    trio.run(main)


def test_the_last_broker_to_go_is_fenced_before_it_is_told_to():
    """No other broker is active, so nothing waits for one to catch up: the heartbeat that
    writes the shutdown's steps also writes the fence, then answers "shut down"."""

    async def main() -> None:
        server, lifecycle = await cluster()
        for b in (2, 3):
            body = {"broker_id": b, "broker_epoch": server.image().brokers[b].epoch, "reason": "x"}
            await server.submit("FenceBroker", body)
        first = await heartbeat(lifecycle, server, 1, shutdown=True)
        assert first.should_shut_down
        assert server.image().brokers[1].fenced
        assert [c["api"] for c in server.commands[-1:]] == ["FenceBroker"]

    trio.run(main)
