"""An unfence cut off between its steps (issue 24: a whole-cluster restart left partitions
leaderless for good) is finished by the next active controller: ``BrokerLifecycle`` searches its
image on activation and the broker's next heartbeat repeats UnfenceBroker with ``continue``.

The write path here is the real state machine's ``propose`` (the server's step loop without
Raft): what is tested is the lifecycle's bookkeeping, on a real image."""

from __future__ import annotations

import trio

from kraft.broker_lifecycle import BrokerLifecycle
from kraft.controller.settings import ControllerSettings
from kraft.records import LEADER_NONE
from kraft.rpc.bodies import BrokerHeartbeatRequest
from testsupport.state_machine_server import StateMachineServer, activate_with_brokers


def leaderless(server: StateMachineServer) -> int:
    return sum(
        p.leader == LEADER_NONE
        for t in server.image().topics_by_id.values()
        for p in t.partitions.values()
    )


async def heartbeat(lifecycle: BrokerLifecycle, server: StateMachineServer, broker: int) -> None:
    reg = server.image().brokers[broker]
    req = BrokerHeartbeatRequest(
        broker_id=broker,
        broker_epoch=reg.epoch,
        metadata_offset=server.image().offset,
        want_fence=False,
        want_shutdown=False,
    )
    await lifecycle.heartbeat(req, {}, None)


async def cluster_with_every_broker_fenced() -> tuple[StateMachineServer, BrokerLifecycle]:
    """3 brokers, 40 partitions RF 3, then every broker fenced: each partition leaderless, its
    ISR the broker fenced last. Steps of 4 records make an unfence take several steps."""
    server = StateMachineServer(ControllerSettings(cluster_id="c", transition_step_records=4))
    await activate_with_brokers(server, (1, 2, 3))
    lifecycle = BrokerLifecycle(server, 9000)  # type: ignore[arg-type]  # see StateMachineServer
    for b in (1, 2, 3):
        await server.submit(
            "UnfenceBroker", {"broker_id": b, "broker_epoch": server.image().brokers[b].epoch}
        )
    await server.submit(
        "CreateTopics", {"topics": [{"name": "t", "num_partitions": 40, "replication_factor": 3}]}
    )
    for b in (1, 2, 3):
        body = {"broker_id": b, "broker_epoch": server.image().brokers[b].epoch, "reason": "x"}
        await server.submit("FenceBroker", body)
    assert leaderless(server) == 40
    return server, lifecycle


def test_a_heartbeat_finishes_an_unfence_whose_steps_failed():
    async def main() -> None:
        server, lifecycle = await cluster_with_every_broker_fenced()
        isr_of_3 = sum(
            p.isr == (3,)
            for t in server.image().topics_by_id.values()
            for p in t.partitions.values()
        )
        assert isr_of_3 > 4  # more than one step's worth
        server.cut_after = 1  # the unfence record and 3 elections, then the controller fails
        await heartbeat(lifecycle, server, 3)
        assert not server.image().brokers[3].fenced
        assert leaderless(server) == 40 - 3  # stuck so far
        assert lifecycle.unfinished_unfence == {3}
        server.cut_after = None
        await heartbeat(lifecycle, server, 3)  # the next heartbeat resumes it
        assert leaderless(server) == 40 - isr_of_3
        assert lifecycle.unfinished_unfence == set()
        assert server.commands[-1]["continue"] is True

    trio.run(main)


def test_a_new_active_controller_finds_unfences_cut_off_before_it():
    async def main() -> None:
        server, lifecycle = await cluster_with_every_broker_fenced()
        server.cut_after = 1
        await heartbeat(lifecycle, server, 3)
        server.cut_after = None
        stuck = leaderless(server)
        # another controller becomes active: it knows nothing of the failed step
        fresh = BrokerLifecycle(server, 9000)  # type: ignore[arg-type]  # see StateMachineServer
        fresh.reset()
        await heartbeat(fresh, server, 3)  # no search yet: nothing to resume
        assert leaderless(server) == stuck
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fresh.session_timer_loop)
            with trio.fail_after(5):
                while fresh.unfinished_unfence != {3}:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        await heartbeat(fresh, server, 3)
        assert leaderless(server) < stuck
        assert all(
            p.leader == 3
            for t in server.image().topics_by_id.values()
            for p in t.partitions.values()
            if 3 in p.isr
        )
        assert fresh.unfinished_unfence == set()

    trio.run(main)
