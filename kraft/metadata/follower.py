"""The log follower: the one FetchMetadata / FetchSnapshot long-poll client of the metadata log.

A :class:`LogFollower` asks any controller for ``FetchMetadata(from_offset, max_wait_ms[,
max_bytes])`` from its target's next offset, over and over, and hands each answer to a
:class:`FollowTarget`: the batches (still encoded: each reader decodes and replays them its own
way, usually with ``kraft.metadata.replay``) or, when a controller says to load a snapshot, the
snapshot's description. The next request goes out as soon as an answer has been handled (no timer
in the path: a controller answers a waiting long poll when an entry commits, so a follower sees
a commit one round trip later). A failed request (``KraftError``: the client has already tried
the other controllers and followed leader hints) either raises (``retry=None``) or is retried
after a delay that doubles from ``retry[0]`` up to ``retry[1]`` and starts again after a success.
:meth:`LogFollower.fetch_snapshot` streams a snapshot into a file, or just enough of it for its
header. Users: the broker's metadata loader, the log reader (``kraft shell``/``log diff`` against
live controllers) and the simulated brokers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import trio

from kraft.errors import KraftError
from kraft.log.segment import FRAME_HEADER, HEADER_SIZE
from kraft.log.snapshot import SUFFIX as SNAPSHOT_SUFFIX

__all__ = [
    "Backoff",
    "FollowTarget",
    "LogFollower",
    "SnapshotFetchError",
    "check_snapshot_name",
    "fetch_metadata_body",
]


class SnapshotFetchError(Exception):
    """A snapshot a controller offered cannot be fetched as offered (bad name, cut short)."""


class FollowTarget(Protocol):
    """What a :class:`LogFollower` feeds: where to fetch from and what to do with answers."""

    def next_offset(self) -> int:
        """The offset the next FetchMetadata asks from."""
        ...

    async def on_batches(self, batches: list[bytes], high_watermark: int) -> bool:
        """Handle one answer's encoded batches (maybe none); True stops following."""
        ...

    async def on_snapshot(self, info: dict[str, Any]) -> None:
        """A controller says to load snapshot ``info`` (``name``, ``end_offset``, ``size``)."""
        ...


class Caller(Protocol):
    """The part of ``kraft.rpc.client.ControllerClient`` a follower uses."""

    async def call(
        self,
        api: str,
        body: dict[str, Any],
        *,
        timeout: float | None = None,
        attempt_timeout: float | None = None,
    ) -> Any: ...


def fetch_metadata_body(
    from_offset: int, max_wait_ms: int, max_bytes: int | None, leader_only: bool = False
) -> dict[str, Any]:
    """A FetchMetadata request body (``max_bytes`` None: left out, the controller's cap;
    ``leader_only``: only the active controller may answer)."""
    body: dict[str, Any] = {"from_offset": from_offset, "max_wait_ms": max_wait_ms}
    if max_bytes is not None:
        body["max_bytes"] = max_bytes
    if leader_only:
        body["leader_only"] = True
    return body


def check_snapshot_name(name: str) -> None:
    """Refuse a snapshot name that is not a plain ``*.checkpoint`` file name."""
    if "/" in name or not name.endswith(SNAPSHOT_SUFFIX):
        raise SnapshotFetchError(f"controller offered a snapshot with a bad name {name!r}")


class Backoff:
    """Retry delays: ``initial``, doubling up to ``maximum``; :meth:`reset` after a success."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum = initial, maximum
        self.delay = initial

    def next(self) -> float:
        """The delay to wait now; the following one doubles (capped)."""
        delay = self.delay
        self.delay = min(delay * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self.delay = self.initial


class LogFollower:
    """Long-polls the controllers' metadata log for one :class:`FollowTarget` (module doc).

    ``timeout``: a whole FetchMetadata call (all controllers); ``attempt_timeout``: how long one
    controller may take to answer (None: the client's default); ``retry``: (first, longest)
    delay after a failed call, or None to raise it; ``on_error(error, from_offset, delay)`` is
    told of each failure before the delay. ``leader_only``: fetch from the active controller only
    (brokers, as Kafka's brokers do: a follower controller learns of each commit one Raft append
    round later, so its long-polls answer ~20 ms after the leader's)."""

    def __init__(
        self,
        client: Caller,
        *,
        max_wait_ms: int,
        timeout: float,
        max_bytes: int | None = None,
        attempt_timeout: float | None = None,
        retry: tuple[float, float] | None = (0.05, 2.0),
        on_error: Callable[[KraftError, int, float], None] | None = None,
        leader_only: bool = False,
    ) -> None:
        self.client = client
        self.leader_only = leader_only
        self.max_wait_ms = max_wait_ms
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.attempt_timeout = attempt_timeout
        self.retry = retry
        self.on_error = on_error

    async def follow(self, target: FollowTarget) -> None:
        """Fetch and hand over answers until the target says stop (or cancellation)."""
        backoff = Backoff(*self.retry) if self.retry is not None else None
        while True:
            from_offset = target.next_offset()
            try:
                resp = await self.client.call(
                    "FetchMetadata",
                    fetch_metadata_body(
                        from_offset, self.max_wait_ms, self.max_bytes, self.leader_only
                    ),
                    timeout=self.timeout,
                    attempt_timeout=self.attempt_timeout,
                )
            except KraftError as e:
                if backoff is None:
                    raise
                delay = backoff.next()
                if self.on_error is not None:
                    self.on_error(e, from_offset, delay)
                await trio.sleep(delay)
                continue
            if backoff is not None:
                backoff.reset()
            snapshot = resp.get("snapshot")
            if snapshot:
                await target.on_snapshot(snapshot)
                continue
            if await target.on_batches(
                list(resp.get("batches") or []), int(resp.get("high_watermark", -1))
            ):
                return

    async def fetch_snapshot(
        self,
        name: str,
        path: Path,
        *,
        max_bytes: int,
        timeout: float,
        header_only: bool = False,
    ) -> None:
        """Stream snapshot ``name`` into ``path`` with FetchSnapshot: all of it, or
        (``header_only``) just enough for its header. Raises SnapshotFetchError for a bad name or
        a snapshot that ends before its announced size, KraftError for a failed call."""
        check_snapshot_name(name)
        position = 0
        with open(path, "wb") as f:
            while True:
                resp = await self.client.call(
                    "FetchSnapshot",
                    {"name": name, "position": position, "max_bytes": max_bytes},
                    timeout=timeout,
                )
                data = resp.get("data") or b""
                f.write(data)
                position += len(data)
                if resp.get("done"):
                    return
                if not data:
                    size = resp.get("size")
                    if size is not None and position < size:
                        raise SnapshotFetchError(
                            f"snapshot {name} ended at byte {position} of {size}"
                        )
                    return
                if header_only and position >= HEADER_SIZE:
                    f.flush()
                    header_len = FRAME_HEADER.unpack(path.read_bytes()[:HEADER_SIZE])[0]
                    if position >= HEADER_SIZE + header_len:
                        return
