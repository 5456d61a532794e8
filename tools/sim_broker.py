"""Lightweight simulated brokers for benchmarks and controller tests.

A :class:`SimBroker` speaks the real controller RPC: it registers with a fresh incarnation id,
long-polls ``FetchMetadata`` and replays what it fetched, and heartbeats with the offset it has
replayed, so the controller unfences it exactly as it would a real broker. It keeps no partition
logs. Many of them run in one trio process and share one :class:`SharedReplay`: every fetched
batch is hashed and chained per broker (base offset and ``prev_hash`` must continue that broker's
own log), and strictly decoded and replayed into the shared image the first time any broker of
the process sees it — the brokers all follow the same log, so one image serves them all.
"""
from __future__ import annotations

import time
import uuid
from typing import Any
from dataclasses import dataclass, field

import trio

from kraft.errors import ErrorCode, KraftError
from kraft.heap import HeapFreezer
from kraft.image import MetadataDelta, MetadataImage, ReplayError
from kraft.records import ZERO_HASH, batch_hash, decode_batch
from kraft.rpc.client import ControllerClient


Verified = tuple[int, int, bytes, bytes]  # base offset, last offset, prev_hash, hash of a batch

RECENT_BYTES = 64 << 20
"""How many bytes of recently verified batches :class:`SharedReplay` keeps to recognise them."""


class SharedReplay:
    """The metadata image of the log every simulated broker of this process follows.

    Every broker fetches the same batches: the first copy is hashed, strictly decoded and
    replayed; a later copy with the same bytes at the same offset (compared byte for byte, ~100x
    cheaper than hashing them again) gets the same answer. Copies of older batches than the
    recent ones kept are hashed and looked up by hash."""

    def __init__(self) -> None:
        self.image = MetadataImage.EMPTY
        self._delta = MetadataDelta(self.image)
        # batch hash -> (base offset, last offset, prev_hash) of every batch replayed
        self._known: dict[bytes, tuple[int, int, bytes]] = {}
        # base offset -> (bytes, answer) of recent batches, oldest first, at most RECENT_BYTES
        self._recent: dict[int, tuple[bytes, Verified]] = {}
        self._recent_bytes = 0
        self._heap = HeapFreezer()

    def verify(self, encoded: bytes, base_offset: int | None = None) -> Verified:
        """(base offset, last offset, prev_hash, hash) of ``encoded``; strictly decoded and
        replayed the first time it is seen. ``base_offset``: where the caller expects the batch
        (lets a copy of a recent batch be recognised by comparing bytes). Raises ReplayError (or
        RecordDecodeError) for a batch that does not continue the shared log."""
        recent = self._recent.get(base_offset) if base_offset is not None else None
        if recent is not None and recent[0] == encoded:
            return recent[1]
        digest = batch_hash(encoded)
        known = self._known.get(digest)
        if known is None:
            batch = decode_batch(encoded)
            self._delta.replay_batch(batch, digest)
            known = self._known[digest] = (batch.base_offset, batch.last_offset, batch.prev_hash)
            self._heap.note(len(batch.records))
        answer = (*known, digest)
        self._remember(encoded, answer)
        return answer

    def _remember(self, encoded: bytes, answer: Verified) -> None:
        if answer[0] in self._recent:
            return
        self._recent[answer[0]] = (encoded, answer)
        self._recent_bytes += len(encoded)
        while self._recent_bytes > RECENT_BYTES:
            oldest = next(iter(self._recent))
            self._recent_bytes -= len(self._recent.pop(oldest)[0])

    def publish(self) -> MetadataImage:
        """Apply what was replayed since the last call; returns the shared image."""
        if self._delta.offset != self.image.offset:
            self.image = self._delta.apply()
            self._delta = MetadataDelta(self.image)
        return self.image


@dataclass
class SimBroker:
    broker_id: int
    bootstrap: list[tuple[str, int]]
    cluster_id: str
    rack: str | None = None
    heartbeat_interval_s: float = 0.5
    epoch: int = -1
    metadata_offset: int = -1
    fenced: bool = True
    incarnation_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    want_shutdown: bool = False
    shut_down: bool = False
    credentials: Any = None  # kraft.rpc.auth.ClientCredentials for clusters with RPC auth
    replay: SharedReplay = field(default_factory=SharedReplay)
    last_hash: bytes = ZERO_HASH
    last_heartbeat: float | None = None  # time.monotonic() when the last heartbeat was sent and answered

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Register, then follow the log and heartbeat until cancelled or shut down."""
        client = ControllerClient(self.bootstrap, client_id=f"sim-broker-{self.broker_id}",
                                  credentials=self.credentials)
        try:
            await self._register(client)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._follow_log)
                task_status.started(self)
                await self._heartbeat_loop(client)
                nursery.cancel_scope.cancel()
        finally:
            await client.aclose()

    async def _register(self, client: ControllerClient) -> None:
        body = {"broker_id": self.broker_id, "cluster_id": self.cluster_id,
                "incarnation_id": self.incarnation_id,
                "listeners": [{"name": "PLAINTEXT", "host": "127.0.0.1", "port": 19000 + self.broker_id,
                               "security_protocol": "PLAINTEXT"}],
                "rack": self.rack,
                "features": [{"name": "metadata.version", "min_version": 1, "max_version": 1000}]}
        result = await client.call("BrokerRegistration", body, timeout=30)
        self.epoch = result["broker_epoch"]

    async def _follow_log(self) -> None:
        client = ControllerClient(self.bootstrap, client_id=f"sim-broker-{self.broker_id}-fetch",
                                  credentials=self.credentials)
        try:
            while True:
                try:
                    result = await client.call("FetchMetadata", {"from_offset": self.metadata_offset + 1,
                                                                 "max_wait_ms": 500}, timeout=10)
                except KraftError:
                    await trio.sleep(0.1)
                    continue
                if result.get("snapshot"):
                    raise RuntimeError(f"simulated broker {self.broker_id}: the controllers' log starts after "
                                       f"offset {self.metadata_offset + 1}; simulated brokers follow it from "
                                       "the start and do not load snapshots")
                self._replay(result.get("batches") or [])
        finally:
            await client.aclose()

    def _replay(self, batches: list[bytes]) -> None:
        """Verify and replay fetched batches: each must continue this broker's own chain."""
        for encoded in batches:
            base, last, prev_hash, digest = self.replay.verify(encoded, self.metadata_offset + 1)
            if last <= self.metadata_offset:
                continue
            if base != self.metadata_offset + 1 or prev_hash != self.last_hash:
                raise ReplayError(f"simulated broker {self.broker_id}: batch at offset {base} does not "
                                  f"continue its log at offset {self.metadata_offset}")
            self.metadata_offset, self.last_hash = last, digest
        if batches:
            self.replay.publish()

    async def _heartbeat_loop(self, client: ControllerClient) -> None:
        while True:
            sent = time.monotonic()
            try:
                reply = await client.call("BrokerHeartbeat", {
                    "broker_id": self.broker_id, "broker_epoch": self.epoch,
                    "metadata_offset": self.metadata_offset, "want_fence": False,
                    "want_shutdown": self.want_shutdown}, timeout=10)
            except KraftError as e:
                if e.code in (ErrorCode.STALE_BROKER_EPOCH, ErrorCode.BROKER_ID_NOT_REGISTERED):
                    await self._register(client)
                else:
                    await trio.sleep(0.1)
                continue
            self.last_heartbeat = sent
            self.fenced = reply["is_fenced"]
            if reply["should_shut_down"]:
                self.shut_down = True
                return
            await trio.sleep(self.heartbeat_interval_s)


async def wait_unfenced(brokers: list[SimBroker], timeout_s: float) -> None:
    """Wait until every broker is unfenced, or raise ``trio.TooSlowError``."""
    with trio.fail_after(timeout_s):
        while any(b.fenced for b in brokers):
            await trio.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.sim_broker --cluster DIR --count N``: run N simulated brokers until killed."""
    import argparse
    import json
    from pathlib import Path

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cluster", required=True, help="cluster directory (reads cluster.json)")
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--first-id", type=int, default=101)
    parser.add_argument("--racks", default="", help="comma-separated racks, assigned round-robin")
    args = parser.parse_args(argv)
    meta = json.loads((Path(args.cluster) / "cluster.json").read_text())
    bootstrap = [(c["host"], c["rpc_port"]) for c in meta["controllers"]]
    racks = [r for r in args.racks.split(",") if r]
    credentials = None
    if meta.get("auth_dir"):  # a cluster started with --auth: log in as its broker user
        from kraft.rpc.auth import ClientCredentials
        credentials = ClientCredentials.load(Path(meta["auth_dir"]) / "broker.credentials")
    replay = SharedReplay()
    brokers = [SimBroker(args.first_id + i, bootstrap, meta["cluster_id"],
                         rack=racks[i % len(racks)] if racks else None, credentials=credentials,
                         replay=replay)
               for i in range(args.count)]

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            for b in brokers:
                nursery.start_soon(b.run)
            await wait_unfenced(brokers, 60)
            print("ready", flush=True)

    trio.run(run)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
