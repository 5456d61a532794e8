"""Controller RPC over loopback: handler results, error mapping, redirects, bad frames."""

from __future__ import annotations

import struct
from typing import Any

import pytest
import trio

from kraft.errors import ErrorCode, KraftError
from kraft.rpc.client import ControllerClient, call_sync
from kraft.rpc.framing import FrameDecoder, encode_frame
from kraft.rpc.server import RequestContext, RpcServer

pytestmark = pytest.mark.timeout(60)


def trio_test(fn: Any) -> Any:
    """Run an async test under trio (no pytest-trio dependency)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        trio.run(functools.partial(fn, *args, **kwargs))

    return wrapper


class Recorder:
    def __init__(self, name: str, leader: tuple[int, str, int] | None = None) -> None:
        self.name = name
        self.leader = leader  # (id, host, port) of the active controller, None = we are it
        self.seen: list[tuple[str, dict, RequestContext]] = []

    async def __call__(self, api: str, body: dict, ctx: RequestContext) -> dict:
        self.seen.append((api, body, ctx))
        if api == "ListTopics" and body.get("boom"):
            raise RuntimeError("boom")
        if api == "DescribeTopics":
            names = body.get("names") or []
            if "slow" in names:
                await trio.sleep(0.2)
            if "missing" in names:
                raise KraftError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no such topic")
            return {"offset": 1, "topics": [{"name": n} for n in names], "by": self.name}
        if self.leader is not None and api == "CreateTopics":
            err = KraftError(ErrorCode.NOT_CONTROLLER, "not the active controller")
            lid, host, port = self.leader
            err.body = {"leader_id": lid, "leader_host": host, "leader_port": port}
            raise err
        return {"by": self.name, "request_id": ctx.request_id, "client_id": ctx.client_id}


async def start(nursery: trio.Nursery, handler: Any, **kw: Any) -> tuple[RpcServer, int]:
    server = RpcServer("127.0.0.1", 0, handler, **kw)
    port = await nursery.start(server.serve)
    return server, port


async def raw_call(port: int, frames: bytes) -> list[dict]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(frames)
        dec = FrameDecoder()
        out: list[dict] = []
        with trio.fail_after(5):
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return out
                out += dec.feed(data)
                if len(out) >= frames.count(b"correlation_id"):
                    return out


@trio_test
async def test_handler_results_errors_and_order() -> None:
    async with trio.open_nursery() as nursery:
        handler = Recorder("a")
        _, port = await start(nursery, handler)
        client = ControllerClient([("127.0.0.1", port)], client_id="t1")
        body = await client.call("DescribeTopics", {"names": ["x"]})
        assert body["topics"] == [{"name": "x"}]
        with pytest.raises(KraftError) as ei:
            await client.call("DescribeTopics", {"names": ["missing"]})
        assert ei.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        with pytest.raises(KraftError) as ei:
            await client.call("ListTopics", {"boom": True})
        assert ei.value.code == ErrorCode.UNKNOWN_SERVER_ERROR
        with pytest.raises(KraftError) as ei:  # check_request: the body must be a map
            await client.call("CreateTopics", "not a map")  # type: ignore[arg-type]  # deliberately malformed
        assert ei.value.code == ErrorCode.INVALID_REQUEST
        with pytest.raises(KraftError) as ei:
            await client.call("NoSuchApi", {})
        assert ei.value.code == ErrorCode.UNSUPPORTED_VERSION
        # a write carries a request id and the client id
        body = await client.call("CreateTopics", {"topics": []})
        assert body["client_id"] == "t1" and len(body["request_id"]) == 36

        # pipelining: a slow request does not stop later ones; answers in request order
        results: dict[str, dict] = {}

        async def one(name: str) -> None:
            results[name] = await client.call("DescribeTopics", {"names": [name]})

        async with trio.open_nursery() as inner:
            inner.start_soon(one, "slow")
            for i in range(20):
                inner.start_soon(one, f"t{i}")
        assert results["slow"]["topics"] == [{"name": "slow"}]
        assert all(results[f"t{i}"]["topics"] == [{"name": f"t{i}"}] for i in range(20))

        # raw connection: answers come back in request order, the envelope is checked
        frames = b"".join(
            encode_frame(
                {
                    "api": "DescribeTopics",
                    "version": 0,
                    "correlation_id": c,
                    "body": {"names": ["slow" if c == 1 else "fast"]},
                }
            )
            for c in (1, 2, 3)
        )
        got = await raw_call(port, frames)
        assert [g["correlation_id"] for g in got] == [1, 2, 3]
        got = await raw_call(
            port, encode_frame({"api": 5, "version": 0, "correlation_id": 9, "body": {}})
        )
        assert got[0]["error_code"] == ErrorCode.INVALID_REQUEST
        await client.aclose()
        nursery.cancel_scope.cancel()


@trio_test
async def test_not_controller_redirect_between_two_servers() -> None:
    async with trio.open_nursery() as nursery:
        leader = Recorder("leader")
        _, leader_port = await start(nursery, leader)
        follower = Recorder("follower", leader=(2, "127.0.0.1", leader_port))
        _, follower_port = await start(nursery, follower)
        client = ControllerClient([("127.0.0.1", follower_port)])
        body = await client.call("CreateTopics", {"topics": []})
        assert body["by"] == "leader"
        assert client.connected_to == ("127.0.0.1", leader_port)
        # the retry kept the request id
        follower_rid = [c.request_id for a, _, c in follower.seen if a == "CreateTopics"]
        assert follower_rid == [body["request_id"]]

        # leader unknown everywhere: NOT_CONTROLLER with the hint body after the deadline
        lost = Recorder("lost", leader=(-1, "", 0))
        _, lost_port = await start(nursery, lost)
        client2 = ControllerClient([("127.0.0.1", lost_port)])
        with pytest.raises(KraftError) as ei:
            await client2.call("CreateTopics", {"topics": []}, timeout=0.5)
        assert ei.value.code == ErrorCode.NOT_CONTROLLER
        assert ei.value.body == {"leader_id": -1, "leader_host": "", "leader_port": 0}
        rids = {c.request_id for a, _, c in lost.seen}
        assert len(lost.seen) >= 2 and len(rids) == 1
        await client.aclose()
        await client2.aclose()
        nursery.cancel_scope.cancel()


@trio_test
async def test_dead_bootstrap_is_skipped() -> None:
    async with trio.open_nursery() as nursery:
        # a port with nothing listening
        sock = trio.socket.socket()
        await sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
        sock.close()
        _, port = await start(nursery, Recorder("live"))
        client = ControllerClient([("127.0.0.1", dead_port), ("127.0.0.1", port)])
        for _ in range(3):
            assert (await client.call("DescribeTopics", {"names": []}))["by"] == "live"
        await client.aclose()
        nursery.cancel_scope.cancel()


@trio_test
async def test_garbage_and_oversized_frames_close_only_that_connection() -> None:
    async with trio.open_nursery() as nursery:
        server, port = await start(nursery, Recorder("a"), max_frame_bytes=1024)
        client = ControllerClient([("127.0.0.1", port)])
        assert (await client.call("DescribeTopics", {"names": ["a"]}))["by"] == "a"
        for junk in (
            struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1",  # garbage msgpack
            struct.pack(">I", 2048),  # oversized length
            struct.pack(">I", 4) + b"\x93\x01\x02\x03",
        ):  # not a map
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(junk)
            with trio.fail_after(5):
                assert await stream.receive_some(100) == b""  # closed by the server
            await stream.aclose()
        assert server.closed_for_garbage == 3
        # the other client's connection is still the same and working
        conn_before = client.connected_to
        assert (await client.call("DescribeTopics", {"names": ["b"]}))["topics"] == [{"name": "b"}]
        assert client.connected_to == conn_before
        # a request over the server's limit: the server closes, the client gives up at the deadline
        with pytest.raises(KraftError):
            await client.call("DescribeTopics", {"names": ["x" * 4096]}, timeout=0.3)
        # a client with the same limit refuses to send it at all, immediately
        small = ControllerClient([("127.0.0.1", port)], max_frame_bytes=1024)
        with pytest.raises(KraftError) as ei:
            await small.call("DescribeTopics", {"names": ["x" * 4096]}, timeout=30)
        assert ei.value.code == ErrorCode.MESSAGE_TOO_LARGE
        await small.aclose()
        await client.aclose()
        nursery.cancel_scope.cancel()


@trio_test
async def test_slowloris_partial_frame_times_out() -> None:
    async with trio.open_nursery() as nursery:
        _, port = await start(nursery, Recorder("a"), io_timeout=0.3)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(struct.pack(">I", 100) + b"\x81")
        with trio.fail_after(5):
            while True:  # trickle one byte at a time; the frame deadline does not move
                try:
                    await stream.send_all(b"\xa1")
                except trio.BrokenResourceError:
                    break
                with trio.move_on_after(0.05):
                    try:  # closed with our trickled bytes unread: the close may be a reset
                        if await stream.receive_some(10) == b"":
                            break
                    except trio.BrokenResourceError:
                        break
        await stream.aclose()
        nursery.cancel_scope.cancel()


def test_call_sync_runs_its_own_trio() -> None:
    import threading

    ready = threading.Event()
    port_box: list[int] = []
    stop: list[Any] = []

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            _, port = await start(nursery, Recorder("sync"))
            port_box.append(port)
            stop.append((trio.lowlevel.current_trio_token(), nursery.cancel_scope.cancel))
            ready.set()

    thread = threading.Thread(target=lambda: trio.run(serve), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        body = call_sync([("127.0.0.1", port_box[0])], "DescribeTopics", {"names": ["z"]}, 5)
        assert body["by"] == "sync"
    finally:
        token, cancel = stop[0]
        token.run_sync_soon(cancel)
        thread.join(10)


@trio_test
async def test_big_answers_arrive_whole_and_a_peer_that_stops_reading_is_dropped() -> None:
    """Answers go out with a plain non-blocking write first and the rest through trio: 20
    pipelined 200 KB answers (far more than the socket buffers) arrive whole and in order; a
    peer that never reads is disconnected after the io timeout."""

    async def big(api: str, body: dict, ctx: RequestContext) -> dict:
        return {"i": body["i"], "blob": "x" * 200_000}

    async with trio.open_nursery() as nursery:
        server, port = await start(nursery, big, io_timeout=0.5)
        frames = b"".join(
            encode_frame({"correlation_id": i, "api": "ListTopics", "body": {"i": i}})
            for i in range(20)
        )
        answers = await raw_call(port, frames)
        assert [a["correlation_id"] for a in answers] == list(range(20))
        assert all(a["body"] == {"i": a["correlation_id"], "blob": "x" * 200_000} for a in answers)

        deaf = await trio.open_tcp_stream("127.0.0.1", port)
        await deaf.send_all(frames)
        with trio.fail_after(10):
            while server.connections == 0:  # it is being served...
                await trio.sleep(0.01)
            while server.connections:  # ...until the answers it does not take time out
                await trio.sleep(0.05)
        await deaf.aclose()
        nursery.cancel_scope.cancel()


@trio_test
async def test_pipelined_calls_time_out_at_their_own_deadlines_and_the_rest_still_answer() -> None:
    """Calls sharing one connection each end at their own deadline (no cancel scope each: one
    expiry task), whether parked or reading for the others; when the caller reading for the
    others gives up, another waiting one takes over; the connection stays usable. (The server
    answers a connection's requests in order.)"""
    release = trio.Event()
    arrived: list = []  # the requests' "i", as the server gets them

    async def handler(api: str, body: dict, ctx: RequestContext) -> dict:
        arrived.append(body.get("i"))
        wait = body.get("wait")
        if wait == "forever":
            await trio.sleep_forever()
        elif wait == "release":
            await release.wait()
        elif isinstance(wait, float):
            await trio.sleep(wait)
        return {"i": body.get("i")}

    async with trio.open_nursery() as nursery:
        _, port = await start(nursery, handler)
        client = ControllerClient([("127.0.0.1", port)])
        await client.call("ListTopics", {}, timeout=5)  # connected
        outcome: dict[str, Any] = {}

        async def one(name: str, body: dict, timeout: float) -> None:
            t0 = trio.current_time()
            try:
                outcome[name] = (await client.call("ListTopics", body, timeout=timeout))["i"]
            except KraftError as err:
                outcome[name] = (err.code, trio.current_time() - t0)

        async def gives_up() -> None:  # the first caller: it reads for the others, then leaves
            with trio.move_on_after(0.2):
                await client.call("ListTopics", {"wait": 0.5, "i": -1}, timeout=10)
            outcome["gave up"] = True

        async def sent(i: int) -> None:  # the calls start in this order
            with trio.fail_after(5):
                while i not in arrived:
                    await trio.sleep(0.005)

        async with trio.open_nursery() as calls:
            calls.start_soon(gives_up)
            await sent(-1)
            calls.start_soon(one, "released", {"wait": "release", "i": 2}, 10)
            await sent(2)
            calls.start_soon(one, "long", {"wait": "forever", "i": 0}, 1.5)
            calls.start_soon(one, "short", {"wait": "forever", "i": 1}, 0.3)
            with trio.fail_after(5):
                while "short" not in outcome or "gave up" not in outcome:
                    await trio.sleep(0.01)
            assert "released" not in outcome and "long" not in outcome
            assert (
                outcome["short"][0] == ErrorCode.REQUEST_TIMED_OUT
                and 0.25 < outcome["short"][1] < 1.0
            )
            release.set()
            with trio.fail_after(2):
                while "released" not in outcome:
                    await trio.sleep(0.01)
            assert outcome["released"] == 2
        assert outcome["long"][0] == ErrorCode.REQUEST_TIMED_OUT and 1.4 < outcome["long"][1] < 3.0
        assert client.connected_to == ("127.0.0.1", port)  # never reconnected
        await client.aclose()
        nursery.cancel_scope.cancel()
