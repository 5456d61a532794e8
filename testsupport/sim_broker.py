"""Lightweight simulated brokers for benchmarks and controller tests.

A :class:`SimBroker` speaks the real controller RPC: it registers with a fresh incarnation id,
follows the log with ``kraft.metadata.follower.LogFollower`` (FetchMetadata long polls, retried
every 0.1 s) and replays what it fetched, and heartbeats with the offset it has
replayed, so the controller unfences it exactly as it would a real broker. It keeps no partition
logs. Many of them run in one trio process and share one :class:`SharedReplay`: every fetched
batch is hashed and chained per broker (base offset and ``prev_hash`` must continue that broker's
own log), and strictly decoded and replayed into the shared image the first time any broker of
the process sees it — the brokers all follow the same log, so one image serves them all. A
broker told to load a snapshot (it lags too far behind) moves to the snapshot's end when the
process has replayed that far and the snapshot's last hash is the log's there; otherwise the
snapshot is fetched and loaded into the shared replay, once for the process.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from kraft.errors import ErrorCode, KraftError
from kraft.heap import HeapFreezer, gc_paused
from kraft.log.snapshot import SnapshotHeader, read_snapshot_header
from kraft.metadata.delta import MetadataDelta, ReplayError
from kraft.metadata.follower import LogFollower
from kraft.metadata.image import MetadataImage
from kraft.records import ZERO_HASH, batch_hash, decode_batch
from kraft.rpc.client import ControllerClient
from kraft.snapshotter import image_from_snapshot

Verified = tuple[int, int, bytes, bytes]  # base offset, last offset, prev_hash, hash of a batch

FREEZE_EVERY_RECORDS = 20_000  # as a controller's applier (kraft/metadata_applier.py)

SHUTDOWN_POLL_S = 0.25  # heartbeats while waiting for a controlled shutdown's answer, as a broker

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
        self._hash_at: dict[int, bytes] = {}  # last offset -> hash of every batch known
        self._floor = -1  # offsets up to here came from a loaded snapshot, not from replay
        self.loading = trio.Lock()  # held by the broker that loads a snapshot for the process
        self._heap = HeapFreezer(FREEZE_EVERY_RECORDS)

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
            with gc_paused():
                batch = decode_batch(encoded)
                if batch.last_offset > self._floor:
                    self._delta.replay_batch(batch, digest)
            if batch.last_offset > self._floor:
                self._heap.note(len(batch.records))
            # else the loaded snapshot holds it: the broker's own hash chain proves it, since
            # that chain must reach the snapshot's last hash at the floor
            known = self._known[digest] = (batch.base_offset, batch.last_offset, batch.prev_hash)
            self._hash_at[batch.last_offset] = digest
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

    def hash_at(self, offset: int) -> bytes | None:
        """The hash of the batch ending at ``offset``, if this process has seen it."""
        return self._hash_at.get(offset)

    def adopt(self, image: MetadataImage) -> None:
        """Continue from a loaded snapshot's ``image`` if it is ahead of the replay so far."""
        if image.offset <= self._delta.offset:
            return
        self.image, self._delta = image, MetadataDelta(image)
        self._floor = image.offset
        self._hash_at[image.offset] = image.last_hash

    def publish(self) -> MetadataImage:
        """Apply what was replayed since the last call; returns the shared image."""
        if self._delta.offset != self.image.offset:
            with gc_paused():
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
    register_timeout_s: float = 120.0  # how long DUPLICATE_BROKER_REGISTRATION is waited out
    previous_epoch: int = -1  # a restarted broker's disks' epoch (broker.broker_epoch)
    replay: SharedReplay = field(default_factory=SharedReplay)
    last_hash: bytes = ZERO_HASH
    last_heartbeat: float | None = (
        None  # time.monotonic() when the last heartbeat was sent and answered
    )
    _follower: LogFollower = field(init=False, repr=False)  # set when the follow starts
    _wakeup: trio.Event = field(default_factory=trio.Event, repr=False)  # heartbeat now

    async def run(self, task_status: trio.TaskStatus[SimBroker] = trio.TASK_STATUS_IGNORED) -> None:
        """Register, then follow the log and heartbeat until cancelled or shut down."""
        client = ControllerClient(
            self.bootstrap, client_id=f"sim-broker-{self.broker_id}", credentials=self.credentials
        )
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
        body = {
            "broker_id": self.broker_id,
            "cluster_id": self.cluster_id,
            "incarnation_id": self.incarnation_id,
            "listeners": [
                {
                    "name": "PLAINTEXT",
                    "host": "127.0.0.1",
                    "port": 19000 + self.broker_id,
                    "security_protocol": "PLAINTEXT",
                }
            ],
            "rack": self.rack,
            "features": [{"name": "metadata.version", "min_version": 1, "max_version": 1000}],
            "previous_broker_epoch": self.previous_epoch,
        }
        with trio.fail_after(self.register_timeout_s):
            while True:
                try:
                    result = await client.call("BrokerRegistration", body, timeout=30)
                    break
                except KraftError as e:  # as a real broker: wait out our old process's session
                    if e.code != ErrorCode.DUPLICATE_BROKER_REGISTRATION:
                        raise
                    await trio.sleep(0.5)
        self.epoch = result["broker_epoch"]

    async def _follow_log(self) -> None:
        client = ControllerClient(
            self.bootstrap,
            client_id=f"sim-broker-{self.broker_id}-fetch",
            credentials=self.credentials,
        )
        self._follower = LogFollower(
            client, max_wait_ms=500, timeout=10, retry=(0.1, 0.1), leader_only=True
        )
        try:
            await self._follower.follow(self)
        finally:
            await client.aclose()

    def next_offset(self) -> int:
        return self.metadata_offset + 1

    async def on_batches(self, batches: list[bytes], high_watermark: int) -> bool:
        self._replay(batches)
        return False

    async def on_snapshot(self, info: dict[str, Any]) -> None:
        """Told to load a snapshot (lagging, or the log starts later): its header (via
        FetchSnapshot) is enough when this process already replayed up to its end: the header's
        last hash must be the hash of the batch ending there. Otherwise the whole snapshot is
        fetched, verified and loaded into the shared replay, as a broker does."""
        name, end = str(info["name"]), info["end_offset"]
        # one broker of the process at a time: after one has loaded it, the others need its header
        async with self.replay.loading:
            with tempfile.TemporaryDirectory(prefix="sim-broker-") as tmp:
                path = Path(tmp) / Path(name).name
                header = await self._fetch_snapshot(name, path, whole=False)
                known = self.replay.hash_at(end - 1)
                if known is None:
                    await self._fetch_snapshot(name, path, whole=True)
                    image = await trio.to_thread.run_sync(image_from_snapshot, path)
                    self.replay.adopt(image)
                    known = self.replay.hash_at(end - 1)
        if known != header.last_hash or header.end_offset != end:
            raise ReplayError(
                f"simulated broker {self.broker_id}: snapshot {name} does not match the "
                f"log this process replayed (offset {end - 1})"
            )
        if end - 1 > self.metadata_offset:
            self.metadata_offset, self.last_hash = end - 1, header.last_hash

    async def _fetch_snapshot(self, name: str, path: Path, whole: bool) -> SnapshotHeader:
        """FetchSnapshot ``name`` into ``path``: all of it, or just enough for its header."""
        await self._follower.fetch_snapshot(
            name, path, max_bytes=1 << 20, timeout=30, header_only=not whole
        )
        return read_snapshot_header(path)

    def _replay(self, batches: list[bytes]) -> None:
        """Verify and replay fetched batches: each must continue this broker's own chain."""
        for encoded in batches:
            base, last, prev_hash, digest = self.replay.verify(encoded, self.metadata_offset + 1)
            if last <= self.metadata_offset:
                continue
            if base != self.metadata_offset + 1 or prev_hash != self.last_hash:
                raise ReplayError(
                    f"simulated broker {self.broker_id}: batch at offset {base} does not "
                    f"continue its log at offset {self.metadata_offset}"
                )
            self.metadata_offset, self.last_hash = last, digest
        if batches:
            self.replay.publish()

    async def _heartbeat_loop(self, client: ControllerClient) -> None:
        shutdown_answers = 0
        while True:
            sent = time.monotonic()
            try:
                reply = await client.call(
                    "BrokerHeartbeat",
                    {
                        "broker_id": self.broker_id,
                        "broker_epoch": self.epoch,
                        "metadata_offset": self.metadata_offset,
                        "want_fence": False,
                        "want_shutdown": self.want_shutdown,
                    },
                    timeout=10,
                )
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
            interval = self.heartbeat_interval_s
            if self.want_shutdown:  # as the real broker (broker/lifecycle.py): poll the answer
                shutdown_answers += 1
                interval = min(interval, 0.05 if shutdown_answers == 1 else SHUTDOWN_POLL_S)
            with trio.move_on_after(interval):
                await self._wakeup.wait()
            self._wakeup = trio.Event()

    def begin_shutdown(self) -> None:
        """Ask for a controlled shutdown with the next heartbeat, sent now (as a real broker
        does when its shutdown starts)."""
        self.want_shutdown = True
        self._wakeup.set()


async def wait_unfenced(brokers: list[SimBroker], timeout_s: float) -> None:
    """Wait until every broker is unfenced, or raise ``trio.TooSlowError``."""
    with trio.fail_after(timeout_s):
        while any(b.fenced for b in brokers):
            await trio.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    """``python -m testsupport.sim_broker --cluster DIR --count N``: run N simulated brokers until killed."""
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
    brokers = [
        SimBroker(
            args.first_id + i,
            bootstrap,
            meta["cluster_id"],
            rack=racks[i % len(racks)] if racks else None,
            credentials=credentials,
            replay=replay,
        )
        for i in range(args.count)
    ]

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
