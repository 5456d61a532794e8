"""The controller's RPC API handlers and their dispatch table (Kafka's ``ControllerApis``).

:meth:`ControllerApis.handle` is the edge: it looks the API up in :attr:`ControllerApis.handlers`
(a dict from API name to handler), checks the body against the API's request struct
(:func:`kraft.rpc.bodies.decode_request`: a body that does not fit is answered INVALID_REQUEST
naming the field, and no handler runs), then runs the handler with the typed body, the body as
sent and the request context. Writes go to the server's write path, reads to the committed state
machine; the node's own APIs (log fetches, quorum and node descriptions) are answered here, the
broker-lifecycle ones by :class:`kraft.broker_lifecycle.BrokerLifecycle`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import msgspec
import trio

from kraft.divergence_monitor import hashes_at, head_of
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.image_check import can_state, reached_offset
from kraft.records import RecordDecodeError, decode_batch_envelope
from kraft.rpc.apis import APIS
from kraft.rpc.bodies import (
    Body,
    DescribeClusterRequest,
    DescribeNodeRequest,
    DescribeNodeResponse,
    DescribeQuorumRequest,
    DescribeQuorumResponse,
    FetchMetadataRequest,
    FetchMetadataResponse,
    FetchSnapshotRequest,
    ImageChecksum,
    LogHead,
    ObserverStatus,
    SnapshotRef,
    VoterStatus,
    decode_request,
    encode_response,
)
from kraft.rpc.framing import Packed

if TYPE_CHECKING:
    from kraft.controller_server import ControllerServer

MAX_FETCH_BYTES = 4 * 1024 * 1024
MAX_FETCH_WAIT_MS = 30_000
FORWARD_TIMEOUT_S = 3.0  # a follower asking the leader to describe the quorum
DESCRIBE_VOTER_TIMEOUT_S = 1.0

# A handler gets the typed body, the body as sent (a write's pure handler takes the map) and
# the request context; it returns the response body (a map or a response struct).
ApiHandler = Callable[[Any, dict[str, Any], Any], Awaitable[dict[str, Any] | Body | Packed]]

# Writes only the active controller itself issues (its session timer, heartbeats, activation).
CONTROLLER_ISSUED = frozenset(
    {
        "FenceBroker",
        "UnfenceBroker",
        "BeginControlledShutdown",
        "LogDirsOffline",
        "ActivateController",
    }
)


def now_ms() -> int:
    return int(time.time() * 1000)


def _head(log: Any) -> LogHead:
    head = head_of(log)
    return LogHead(offset=head["offset"], hash=head["hash"])


def _reported_head(raw: Any) -> LogHead | None:
    """A log head another voter reported in DescribeNode (None: none, or not understood)."""
    if not isinstance(raw, dict):
        return None
    try:
        return msgspec.convert(raw, LogHead)
    except msgspec.ValidationError:
        return None


class ControllerApis:
    """The dispatch table and the handlers of the node's own APIs."""

    def __init__(self, server: ControllerServer) -> None:
        self.server = server
        # the last FetchMetadata answer without a snapshot or checksum, encoded: (batches, high
        # watermark, encoding); the brokers woken by one commit fetch the same batches
        self._fetched: tuple[list[bytes], int, Packed] | None = None
        lifecycle = server.lifecycle
        self.handlers: dict[str, ApiHandler] = {
            "BrokerRegistration": lifecycle.register,
            "BrokerHeartbeat": lifecycle.heartbeat,
            "FetchMetadata": self.fetch_metadata,
            "FetchSnapshot": self.fetch_snapshot,
            "DescribeCluster": self.describe_cluster,
            "DescribeQuorum": self.describe_quorum,
            "DescribeNode": self.describe_node,
        }
        for name, api in APIS.items():
            if api.kind == "read" and name not in self.handlers:
                self.handlers[name] = partial(self.read, name)
            elif api.kind == "write" and name in CONTROLLER_ISSUED:
                self.handlers[name] = partial(self.refuse_controller_issued, name)
            elif api.kind == "write" and name not in self.handlers:
                self.handlers[name] = partial(self.write, name)
        missing = set(APIS) - set(self.handlers)
        assert not missing, f"APIs without a handler: {sorted(missing)}"

    async def handle(self, api: str, body: dict[str, Any], ctx: Any) -> dict[str, Any] | Packed:
        """Check ``body`` against ``api``'s request type, then run the API's handler."""
        handler = self.handlers.get(api)
        if handler is None:
            raise KraftError(ErrorCode.UNSUPPORTED_VERSION, f"unknown API {api!r}")
        request = decode_request(api, body)
        server = self.server
        if APIS[api].kind != "write" or api in CONTROLLER_ISSUED:
            result = await handler(request, body, ctx)
        else:
            if not server.is_active:
                raise server.not_controller()
            started = time.monotonic()
            try:
                result = await handler(request, body, ctx)
            finally:
                if server.metrics is not None:
                    server.metrics.event_processing.observe((time.monotonic() - started) * 1000)
        return encode_response(result) if isinstance(result, Body) else result

    # ---- reads and writes -------------------------------------------------------------------

    async def read(self, api: str, req: Body, wire: dict[str, Any], ctx: Any) -> dict[str, Any]:
        """A read, answered from this controller's committed image."""
        return self.server.state_machine.read(api, wire)

    async def write(self, api: str, req: Body, wire: dict[str, Any], ctx: Any) -> dict[str, Any]:
        """A write, through the active controller's write path."""
        return await self.server.submit(
            api,
            wire,
            request_id=getattr(ctx, "request_id", None),
            principal=getattr(ctx, "principal", "ANONYMOUS") or "ANONYMOUS",
            client_id=getattr(ctx, "client_id", "") or "",
        )

    async def refuse_controller_issued(
        self, api: str, req: Body, wire: dict[str, Any], ctx: Any
    ) -> dict[str, Any]:
        raise KraftError(
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED, f"{api} is issued by the controller itself"
        )

    # ---- following the log ------------------------------------------------------------------

    async def fetch_metadata(
        self, req: FetchMetadataRequest, wire: dict[str, Any], ctx: Any
    ) -> FetchMetadataResponse | Packed:
        """Batches from ``from_offset`` (long-polling up to ``max_wait_ms`` when there are none
        yet), or the snapshot to load instead."""
        server = self.server
        if req.leader_only and not server.is_active:
            raise server.not_controller()
        log = server.log
        from_offset = req.from_offset
        max_wait = min(max(req.max_wait_ms or 0, 0), MAX_FETCH_WAIT_MS) / 1000
        max_bytes = min(req.max_bytes or MAX_FETCH_BYTES, MAX_FETCH_BYTES)
        snap = self._snapshot_for_fetch(from_offset)
        if snap is not None:
            return FetchMetadataResponse(
                batches=[],
                high_watermark=log.next_offset,
                snapshot=SnapshotRef(
                    name=snap.name,
                    end_offset=server.snapshotter.end_offset(snap),
                    size=snap.stat().st_size,
                ),
            )
        if from_offset >= log.next_offset and max_wait > 0:
            with trio.move_on_after(max_wait):
                while from_offset >= log.next_offset:
                    await server.new_data_event().wait()
        batches = log.read_encoded(from_offset, max_bytes) if from_offset < log.next_offset else []
        high_watermark = log.next_offset
        stated = None
        if req.image_checksum:
            stated = await self._stated_checksum(from_offset, batches)
        if stated is None:
            return self._packed_batches(batches, high_watermark)
        return FetchMetadataResponse(
            batches=batches, high_watermark=high_watermark, snapshot=None, image_checksum=stated
        )

    def _packed_batches(self, batches: list[bytes], high_watermark: int) -> Packed:
        """The encoded answer holding ``batches`` and ``high_watermark``, reused while the
        fetches ask for the same: every broker woken by a commit fetches the same new batches,
        and encoding each answer again was a copy of them per broker (a 2,000-record step of a
        controlled shutdown to 60 brokers). Compared by content, so a log rewritten at the same
        offsets cannot be answered from an old encoding."""
        last = self._fetched
        if last is not None and last[1] == high_watermark and last[0] == batches:
            return last[2]
        body = FetchMetadataResponse(
            batches=batches, high_watermark=high_watermark, snapshot=None, image_checksum=None
        )
        packed = Packed(msgpack.packb(encode_response(body), use_bin_type=True))
        self._fetched = (batches, high_watermark, packed)
        return packed

    async def _stated_checksum(
        self, from_offset: int, batches: list[bytes]
    ) -> ImageChecksum | None:
        """Our image's checksum, when our image is at the offset a fetcher reaches by applying
        ``batches`` (read just now, from ``from_offset``): the last one's end, or
        ``from_offset - 1`` when there are none. Otherwise None: we cannot state it there."""
        server = self.server
        image = server.state_machine.image  # read with the batches: no await in between
        last_end = None
        if batches:
            try:
                last_end = decode_batch_envelope(batches[-1]).last_offset
            except RecordDecodeError:
                return None
        reached = reached_offset(from_offset, last_end)
        if not can_state(image.offset, server.log.next_offset, reached):
            return None
        checksum = await trio.to_thread.run_sync(image.checksum)  # cached per image and topic
        return ImageChecksum(offset=image.offset, checksum=checksum, node_id=server.node_id)

    def _snapshot_for_fetch(self, from_offset: int) -> Path | None:
        """The snapshot a fetcher at ``from_offset`` should load instead of reading the log: when
        the log no longer holds that offset, or when the fetcher is at least
        ``metadata.fetch.snapshot.min.lag.records`` before the newest snapshot's end (a new
        broker on a big image loads the snapshot rather than replaying the whole history)."""
        server = self.server
        log, snapshotter = server.log, server.snapshotter
        if from_offset < log.start_offset:
            snap = snapshotter.latest()
            if snap is None:
                raise KraftError(
                    ErrorCode.OFFSET_OUT_OF_RANGE, f"offset {from_offset} is before the log start"
                )
            return snap
        min_lag = server.config["metadata.fetch.snapshot.min.lag.records"]
        if min_lag < 0:
            return None
        min_lag = max(min_lag, 1)
        if log.next_offset - from_offset < min_lag:
            return None  # the common case (a fetcher near the end) costs no directory listing
        snap = snapshotter.latest()
        if snap is not None and snapshotter.end_offset(snap) - from_offset >= min_lag:
            return snap
        return None

    async def fetch_snapshot(
        self, req: FetchSnapshotRequest, wire: dict[str, Any], ctx: Any
    ) -> dict[str, Any]:
        """One chunk of a snapshot file: ``{data, size, done}``."""
        return self.server.snapshotter.read_chunk(
            req.name, req.position, min(req.max_bytes or MAX_FETCH_BYTES, MAX_FETCH_BYTES)
        )

    # ---- describing the quorum and the node -------------------------------------------------

    async def describe_cluster(
        self, req: DescribeClusterRequest, wire: dict[str, Any], ctx: Any
    ) -> dict[str, Any]:
        """The brokers as our committed image has them. Which brokers' images diverge, and
        which log dirs they have offline, is known to the active controller only (their
        heartbeats report it): it adds ``image_mismatch``, ``offline_log_dirs`` and
        ``offline_replicas`` per broker and ``divergent_brokers``; a standby leaves them out,
        or with ``active_only`` answers NOT_CONTROLLER so that the client asks the active
        one."""
        server = self.server
        if req.active_only and not server.is_active:
            raise server.not_controller()
        resp = server.state_machine.read("DescribeCluster", wire)
        if server.is_active:
            divergent = server.lifecycle.images.divergent
            heartbeats = server.lifecycle.heartbeats
            for broker in resp.get("brokers", []):
                mismatch = divergent.get(broker.get("broker_id"))
                broker["image_mismatch"] = (
                    None if mismatch is None else dataclasses.asdict(mismatch)
                )
                dirs, replicas = heartbeats.offline(broker["broker_id"])
                broker["offline_log_dirs"], broker["offline_replicas"] = list(dirs), replicas
            resp["divergent_brokers"] = sorted(divergent)
        return resp

    async def describe_quorum(
        self, req: DescribeQuorumRequest, wire: dict[str, Any], ctx: Any
    ) -> dict[str, Any] | DescribeQuorumResponse:
        """The quorum as the leader sees it (a follower asks the leader, one hop), with each
        voter's applied offset and log head and the brokers following the log."""
        server = self.server
        quorum = server.quorum
        assert quorum is not None
        status = quorum.status()
        leader_id = status.get("leader_id")
        hint = server.leader_hint()
        if not quorum.is_leader and hint is not None:
            # Only the leader knows its followers' progress; ask it (one hop).
            client = server.peer_client(hint[1], hint[2])
            try:
                with trio.fail_after(FORWARD_TIMEOUT_S):
                    return await client.call("DescribeQuorum", {"forwarded": True})
            except (KraftError, trio.TooSlowError, OSError):
                pass
            finally:
                await client.aclose()
        hw = server.log.next_offset
        described = await self._voter_nodes()
        divergent = server.divergence.divergent
        voters = []
        for vid, (host, port) in sorted(server.config.rpc_voters.items()):
            v = status.get("voters", {}).get(vid, {})
            reply = described.get(vid, {})
            voters.append(
                VoterStatus(
                    node_id=vid,
                    host=host,
                    port=port,
                    raft_match_index=v.get("match_index"),
                    applied_offset=hw - 1 if vid == server.node_id else reply.get("applied_offset"),
                    lag=v.get("lag"),
                    last_contact_ms=v.get("last_contact_ms"),
                    # a follower whose last answer acknowledged the whole log was caught up then
                    last_caught_up_ms=v.get("last_contact_ms") if v.get("lag") == 0 else None,
                    is_leader=vid == leader_id,
                    log_head=_head(server.log)
                    if vid == server.node_id
                    else _reported_head(reply.get("log_head")),
                    divergent_from_offset=divergent.get(vid),
                )
            )
        now = now_ms()
        observers = [
            ObserverStatus(
                broker_id=b,
                metadata_offset=off,
                lag=max(hw - 1 - off, 0),
                last_contact_ms=now - seen,
                last_caught_up_ms=now - caught if caught >= 0 else None,
            )
            for b, (off, seen, caught) in sorted(dict(server.lifecycle.observers).items())
        ]
        return DescribeQuorumResponse(
            cluster_id=server.config.cluster_id,
            leader_id=leader_id if leader_id is not None else -1,
            term=status.get("term", 0),
            commit_index=status.get("commit_index", 0),
            high_watermark=hw,
            voters=voters,
            observers=observers,
            divergent_voters=sorted(divergent),
        )

    async def _voter_nodes(self) -> dict[int, dict[str, Any]]:
        """Ask every other voter to describe itself (1 s budget; silent ones are left out)."""
        server = self.server
        replies: dict[int, dict[str, Any]] = {}

        async def ask(vid: int, host: str, port: int) -> None:
            client = server.peer_client(host, port)
            try:
                with trio.move_on_after(DESCRIBE_VOTER_TIMEOUT_S):
                    replies[vid] = await client.call(
                        "DescribeNode", {"checksum": False}, timeout=DESCRIBE_VOTER_TIMEOUT_S
                    )
            except (KraftError, OSError):
                pass
            finally:
                await client.aclose()

        async with trio.open_nursery() as nursery:
            for vid, (host, port) in server.config.rpc_voters.items():
                if vid != server.node_id:
                    nursery.start_soon(ask, vid, host, port)
        return replies

    async def describe_node(
        self, req: DescribeNodeRequest, wire: dict[str, Any], ctx: Any
    ) -> DescribeNodeResponse:
        """This controller: its image (and checksum), log bounds and head, Raft state."""
        server = self.server
        image = server.state_machine.image
        checksum = await trio.to_thread.run_sync(image.checksum) if req.checksum else None
        quorum = server.quorum
        voter_directories = server.voter_directories
        return DescribeNodeResponse(
            node_id=server.node_id,
            is_active=server.is_active,
            applied_offset=image.offset,
            image_checksum=checksum,
            log_start_offset=server.log.start_offset,
            log_end_offset=server.log.next_offset,
            log_head=_head(server.log),
            hashes=hashes_at(server.log, req.hash_at or []),
            raft=quorum.status() if quorum else {},
            raft_stats=quorum.stats() if quorum else {},
            joining=bool(quorum and quorum.joining),
            directory_id=server.directory_id,
            unverified_voters=sorted(voter_directories.unverified) if voter_directories else [],
        )
