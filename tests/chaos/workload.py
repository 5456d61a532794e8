"""The chaos workload: topic creates, partition additions, config changes and deletes through the
real controller RPC client (:class:`kraft.rpc.client.ControllerClient`), recorded in a
:class:`~tests.chaos.history.History`.

Each worker owns its topics: it creates a fresh name, then issues one operation at a time on it
(add partitions, set a config, delete). After an indeterminate outcome it leaves that topic alone,
so each topic's history stays a simple sequence. A worker keeps at most ``max_live`` topics,
deleting its oldest, so long runs stay the same size. The workload runs in its own thread.
"""

from __future__ import annotations

import collections
import random
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from kraft.errors import ErrorCode, KraftError
from kraft.rpc.client import ControllerClient
from kraft.rpc.framing import FrameDecoder, encode_frame
from tests.chaos.history import FAIL, INFO, OK, History, Op

# Errors that mean "validated and refused, nothing applied". Everything else (timeouts, lost
# connections, NOT_CONTROLLER after retries, unknown server errors) is indeterminate.
DEFINITE_ERRORS = {
    ErrorCode.TOPIC_ALREADY_EXISTS,
    ErrorCode.INVALID_PARTITIONS,
    ErrorCode.INVALID_REPLICATION_FACTOR,
    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
    ErrorCode.INVALID_CONFIG,
    ErrorCode.POLICY_VIOLATION,
    ErrorCode.INVALID_REQUEST,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.INVALID_TOPIC_EXCEPTION,
}


def classify(code: int) -> str:
    """ok / fail / info for an error code (0 = ok)."""
    if code == 0:
        return OK
    try:
        return FAIL if ErrorCode(code) in DEFINITE_ERRORS else INFO
    except ValueError:
        return INFO


def request(kind: str, topic: str, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The (api, body) of one workload operation."""
    if kind == "create":
        return "CreateTopics", {
            "topics": [
                {
                    "name": topic,
                    "num_partitions": args["partitions"],
                    "replication_factor": args["replication_factor"],
                }
            ]
        }
    if kind == "partitions":
        return "CreatePartitions", {"topics": [{"name": topic, "count": args["count"]}]}
    if kind == "config":
        return "IncrementalAlterConfigs", {
            "resources": [
                {
                    "resource_type": "topic",
                    "resource_name": topic,
                    "ops": [{"name": args["key"], "op": "SET", "value": args["value"]}],
                }
            ]
        }
    if kind == "delete":
        return "DeleteTopics", {"names": [topic]}
    raise ValueError(f"unknown operation kind {kind!r}")


def item_error(body: dict[str, Any]) -> tuple[int, str]:
    """The (error_code, message) of a single-item write response."""
    items = body.get("topics") or body.get("resources") or [{}]
    item = items[0] if isinstance(items, list) and items else {}
    return int(item.get("error_code", 0) or 0), str(item.get("error_message") or "")


async def perform(
    call: Callable[[str, dict[str, Any], float, str], Awaitable[dict[str, Any]]],
    history: History,
    kind: str,
    topic: str,
    args: dict[str, Any],
    timeout: float,
) -> Op:
    """Invoke one operation through ``call(api, body, timeout, request_id)`` and record it."""
    request_id = str(uuid.uuid4())
    api, body = request(kind, topic, args)
    op = history.invoke(kind, topic, request_id, args, time.monotonic())
    try:
        reply = await call(api, body, timeout, request_id)
    except KraftError as e:
        history.complete(op, classify(e.code), time.monotonic(), f"{e.code.name}: {e.message}")
        return op
    except (OSError, trio.TooSlowError, trio.BrokenResourceError) as e:
        history.complete(op, INFO, time.monotonic(), repr(e))
        return op
    code, message = item_error(reply)
    history.complete(
        op, classify(code), time.monotonic(), "" if code == 0 else f"{_code_name(code)}: {message}"
    )
    return op


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


async def call_one_node(
    address: tuple[str, int], api: str, body: dict[str, Any], timeout: float, request_id: str
) -> dict[str, Any]:
    """One request to exactly one controller, no retries, no following leader hints (a client
    on the minority side of a partition). Raises KraftError on an error answer."""
    envelope = {
        "api": api,
        "version": 0,
        "correlation_id": 1,
        "body": body,
        "client_id": "chaos-minority",
        "request_id": request_id,
    }
    with trio.fail_after(timeout):
        stream = await trio.open_tcp_stream(*address)
        async with stream:
            await stream.send_all(encode_frame(envelope))
            decoder = FrameDecoder()
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    raise KraftError(ErrorCode.NETWORK_EXCEPTION, "connection closed")
                frames = decoder.feed(data)
                if frames:
                    response = frames[0]
                    break
    if response.get("error_code"):
        raise KraftError(
            ErrorCode(response["error_code"]), str(response.get("error_message") or "")
        )
    result = response.get("body")
    return result if isinstance(result, dict) else {}


class Workload:
    """``workers`` concurrent clients issuing topic operations until :meth:`stop`."""

    def __init__(
        self,
        bootstrap: list[tuple[str, int]],
        history: History,
        seed: int = 0,
        workers: int = 3,
        max_rf: int = 3,
        op_timeout: float = 8.0,
        pause_s: float = 0.05,
        prefix: str = "chaos",
        max_live: int = 10,
    ) -> None:
        self.bootstrap = bootstrap
        self.history = history
        self.rng = random.Random(seed)
        self.workers = workers
        self.max_rf = max_rf
        self.op_timeout = op_timeout
        self.pause_s = pause_s
        self.prefix = prefix
        self.max_live = max_live
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=lambda: trio.run(self._main), name="chaos-workload", daemon=True
        )
        self._error: BaseException | None = None

    def start(self) -> Workload:
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"workload did not stop within {timeout}s")
        if self._error is not None:
            raise self._error

    async def _main(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                for w in range(self.workers):
                    nursery.start_soon(self._worker, w, random.Random(self.rng.getrandbits(64)))
        except BaseException as e:  # surfaced by stop()
            self._error = e

    async def _worker(self, w: int, rng: random.Random) -> None:
        live: collections.deque[str] = collections.deque()  # this worker's topics that exist
        client = ControllerClient(
            self.bootstrap, client_id=f"chaos-{w}", request_timeout=self.op_timeout
        )

        async def call(
            api: str, body: dict[str, Any], timeout: float, request_id: str
        ) -> dict[str, Any]:
            return await client.call(api, body, timeout=timeout, request_id=request_id)

        try:
            n = 0
            while not self._stop.is_set():
                n += 1
                topic = f"{self.prefix}-{w}-{n}"
                if await self._topic_life(call, topic, rng):
                    live.append(topic)
                while len(live) > self.max_live and not self._stop.is_set():
                    await perform(call, self.history, "delete", live.popleft(), {}, self.op_timeout)
        finally:
            await client.aclose()

    async def _topic_life(
        self,
        call: Callable[[str, dict[str, Any], float, str], Awaitable[dict[str, Any]]],
        topic: str,
        rng: random.Random,
    ) -> bool:
        """Create ``topic`` and change it a few times; True when it surely still exists."""
        partitions = rng.randint(1, 3)
        op = await perform(
            call,
            self.history,
            "create",
            topic,
            {"partitions": partitions, "replication_factor": rng.randint(1, self.max_rf)},
            self.op_timeout,
        )
        for _ in range(rng.randint(0, 3)):
            if op.outcome != OK or self._stop.is_set():
                return op.outcome == OK
            await trio.sleep(self.pause_s)
            if rng.random() < 0.5:
                partitions += rng.randint(1, 2)
                op = await perform(
                    call, self.history, "partitions", topic, {"count": partitions}, self.op_timeout
                )
            else:
                op = await perform(
                    call,
                    self.history,
                    "config",
                    topic,
                    {"key": "retention.ms", "value": str(rng.randrange(60_000, 10**9))},
                    self.op_timeout,
                )
        await trio.sleep(self.pause_s)
        if op.outcome == OK and rng.random() < 0.5 and not self._stop.is_set():
            op = await perform(call, self.history, "delete", topic, {}, self.op_timeout)
            await trio.sleep(self.pause_s)
            return False
        return op.outcome == OK

    def ok_since(self, t: float) -> bool:
        """Whether some operation invoked at or after monotonic time ``t`` was acknowledged."""
        return any(op.outcome == OK and op.invoke_s >= t for op in reversed(self.history.ops))
