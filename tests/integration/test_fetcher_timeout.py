"""A follower's fetcher gives up on a leader that accepts its connection but never answers: the
request times out after the fetcher's timeout (its connection's deadline, not a cancel scope
per request) and the fetcher reconnects; a stopped fetcher stops at once; a partition added while
a fetch waits on the leader is fetched at once, on a new connection."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from broker.replica.partition import Partition
from broker.replica.partition_log import PartitionLog
from broker.replica.replica_fetcher import KafkaConnection, ReplicaFetcherManager, SourceFetcher

pytestmark = pytest.mark.integration


async def _silent_leader(accepted: list[float], nursery: trio.Nursery) -> int:
    """A listener that reads whatever comes and answers nothing; its port."""

    async def serve(stream: trio.SocketStream) -> None:
        accepted.append(trio.current_time())
        async with stream:
            while await stream.receive_some(65536):
                pass

    listeners = await nursery.start(trio.serve_tcp, serve, 0)
    return int(listeners[0].socket.getsockname()[1])


def test_silent_leader_times_out_and_is_reconnected(tmp_path: Path) -> None:
    async def main() -> None:
        accepted: list[float] = []
        async with trio.open_nursery() as nursery:
            port = await _silent_leader(accepted, nursery)
            replicas = SimpleNamespace(broker_id=2, partitions={})
            manager = ReplicaFetcherManager(replicas, "PLAINTEXT", max_wait_ms=100, timeout=0.5)
            manager.address = lambda leader: ("127.0.0.1", port)  # type: ignore[method-assign]  # the silent leader
            part = Partition("t", "id", 0, PartitionLog.open(tmp_path / "t-0"))
            part.role, part.leader, part.leader_epoch = "follower", 1, 0
            fetcher = SourceFetcher(manager, 1)
            fetcher.assign([part])
            fetcher.states[part].truncate = False  # straight to fetching
            nursery.start_soon(fetcher.run)
            with trio.fail_after(10):
                while len(accepted) < 2:
                    await trio.sleep(0.05)
            # the first fetch waited its timeout (0.5 s + max wait 0.1 s), then a reconnect
            assert accepted[1] - accepted[0] >= 0.6
            fetcher.scope.cancel()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_partition_added_during_a_waiting_fetch_is_fetched_at_once(tmp_path: Path) -> None:
    """The leader holds the first fetch (it never answers, and the fetcher's timeout is 60 s):
    assigning a second partition abandons that fetch and sends one naming both at once; that
    one is not abandoned in turn (a stream of changes cannot starve the fetcher)."""

    async def main() -> None:
        received: list[bytearray] = []

        async def serve(stream: trio.SocketStream) -> None:
            got = bytearray()
            received.append(got)
            async with stream:
                while chunk := await stream.receive_some(65536):
                    got += chunk

        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, serve, 0)
            port = int(listeners[0].socket.getsockname()[1])
            replicas = SimpleNamespace(broker_id=2, partitions={})
            manager = ReplicaFetcherManager(replicas, "PLAINTEXT", max_wait_ms=500, timeout=60)
            manager.address = lambda leader: ("127.0.0.1", port)  # type: ignore[method-assign]
            first = Partition("first-topic", "id1", 0, PartitionLog.open(tmp_path / "f-0"))
            added = Partition("added-topic", "id2", 0, PartitionLog.open(tmp_path / "a-0"))
            for part in (first, added):
                part.role, part.leader, part.leader_epoch = "follower", 1, 0
            fetcher = SourceFetcher(manager, 1)
            fetcher.assign([first])
            nursery.start_soon(fetcher.run)
            with trio.fail_after(10):
                while not (received and b"first-topic" in received[0]):
                    await trio.sleep(0.01)
            fetcher.assign([first, added])
            with trio.fail_after(10):  # not the 60 s the leader would keep the first fetch
                while not (len(received) > 1 and b"added-topic" in received[-1]):
                    await trio.sleep(0.01)
            assert b"first-topic" in received[-1]
            assert not any(b"added-topic" in r for r in received[:-1])
            # the fetch after an abandoned one is not abandoned: no third connection
            third = Partition("third-topic", "id3", 0, PartitionLog.open(tmp_path / "t-0"))
            third.role, third.leader, third.leader_epoch = "follower", 1, 0
            assert fetcher._fetch_scope is None  # the fetch in flight is not abandonable
            fetcher.assign([first, added, third])
            await trio.testing.wait_all_tasks_blocked(0.05)  # the fetcher had its chance
            assert len(received) == 2
            fetcher.scope.cancel()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_request_without_an_owner_scope_raises_too_slow() -> None:
    async def main() -> None:
        accepted: list[float] = []
        async with trio.open_nursery() as nursery:
            port = await _silent_leader(accepted, nursery)
            conn = await KafkaConnection.open("127.0.0.1", port, "t", 5)
            started = trio.current_time()
            try:
                await conn.request(18, 0, b"", 0.3)
            except trio.TooSlowError:
                assert trio.current_time() - started >= 0.3
            else:
                raise AssertionError("a silent leader answered")
            await conn.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)
