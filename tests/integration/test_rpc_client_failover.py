"""The controller client follows the quorum, not a socket: a controller that accepts a request
and never answers (stalled, SIGSTOPped) is dropped after one attempt timeout, marked suspect,
and the call gets its answer from another controller; leader hints naming the suspect are not
followed until another controller names a new leader."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from kraft.errors import ErrorCode, KraftError
from kraft.rpc.client import ControllerClient
from kraft.rpc.server import RequestContext, RpcServer

pytestmark = pytest.mark.timeout(60)


class Stalled:
    """A controller that takes requests and never answers."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, api: str, body: dict, ctx: RequestContext) -> dict:
        self.seen.append(ctx.request_id or "")
        await trio.sleep_forever()
        raise AssertionError("unreachable")


class Follower:
    """Names ``leader`` as the active controller until ``elected`` is set, then answers."""

    def __init__(self, leader: tuple[str, int]) -> None:
        self.leader = leader
        self.elected = trio.Event()
        self.hints = 0

    async def __call__(self, api: str, body: dict, ctx: RequestContext) -> dict:
        if not self.elected.is_set():
            self.hints += 1
            err = KraftError(ErrorCode.NOT_CONTROLLER, "not the active controller")
            host, port = self.leader
            err.body = {"leader_id": 1, "leader_host": host, "leader_port": port}
            raise err
        return {"by": "new leader", "request_id": ctx.request_id}


async def start(nursery: trio.Nursery, handler: Any) -> tuple[str, int]:
    port = await nursery.start(RpcServer("127.0.0.1", 0, handler).serve)
    return ("127.0.0.1", port)


def test_stalled_controller_is_left_after_one_attempt() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            stalled = Stalled()
            a = await start(nursery, stalled)
            follower = Follower(a)
            b = await start(nursery, follower)
            client = ControllerClient([a, b], attempt_timeout=0.5, suspect_s=5.0)
            client._next = 0  # the stalled one first, as when it was the active controller
            t0 = trio.current_time()
            # the follower still names the stalled controller; the new leader is elected at 1 s
            nursery.start_soon(lambda: _elect_after(follower, 1.0))
            resp = await client.call("CreateTopics", {"topics": []}, timeout=5.0)
            took = trio.current_time() - t0
            assert resp["by"] == "new leader" and 1.0 <= took < 2.5, took
            assert client.is_suspect(a) and not client.is_suspect(b)
            # asked once (the hint naming it was not followed), with the request id kept
            assert stalled.seen == [resp["request_id"]]
            assert follower.hints >= 1
            t1 = trio.current_time()
            await client.call("DescribeTopics", {"names": []}, timeout=5.0)
            assert trio.current_time() - t1 < 0.3  # straight to the live controller
            await client.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)


async def _elect_after(follower: Follower, delay: float) -> None:
    await trio.sleep(delay)
    follower.elected.set()


def test_a_call_shorter_than_an_attempt_suspects_nobody() -> None:
    """A call that runs out of its own time says nothing about the controller: it ends with
    REQUEST_TIMED_OUT at its deadline and nobody becomes suspect."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            a = await start(nursery, Stalled())
            client = ControllerClient([a], attempt_timeout=2.0)
            t0 = trio.current_time()
            with pytest.raises(KraftError) as ei:
                await client.call("DescribeTopics", {"names": []}, timeout=0.3)
            assert ei.value.code == ErrorCode.REQUEST_TIMED_OUT
            assert 0.25 < trio.current_time() - t0 < 1.0
            assert not client.is_suspect(a) and client.connected_to == a
            await client.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_every_controller_silent_times_out_with_a_clear_error() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            a = await start(nursery, Stalled())
            b = await start(nursery, Stalled())
            client = ControllerClient([a, b], attempt_timeout=0.4)
            t0 = trio.current_time()
            with pytest.raises(KraftError) as ei:
                await client.call("DescribeTopics", {"names": []}, timeout=1.5)
            assert ei.value.code == ErrorCode.REQUEST_TIMED_OUT
            assert "did not answer within 0.4s" in ei.value.message
            assert trio.current_time() - t0 < 2.0
            assert client.is_suspect(a) and client.is_suspect(b)
            await client.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_suspicion_lasts_twice_the_calls_attempt_timeout() -> None:
    """A broker's client keeps the default attempt timeout (5 s) and passes 1 s per heartbeat:
    the controller it found silent is suspect for 2 s, not 10 s, so hints naming it are followed
    again soon (it may be elected again)."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            a = await start(nursery, Stalled())
            client = ControllerClient([a])
            with pytest.raises(KraftError):
                await client.call("DescribeTopics", {"names": []}, timeout=0.4, attempt_timeout=0.3)
            assert client.is_suspect(a)
            await trio.sleep(0.7)
            assert not client.is_suspect(a)
            await client.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)
