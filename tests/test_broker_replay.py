"""A real broker process against a fake controller speaking the controller RPC: registration,
heartbeats to RUNNING, metadata replay into partitions and the Kafka listener, failover between
controllers, snapshot loading, checkpoint resume, corrupt checkpoint, SIGTERM shutdown."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import trio

from broker.checkpoint import write_checkpoint
from broker.state import describe
from kraft.errors import ErrorCode, KraftError
from kraft.image import MetadataDelta, MetadataImage
from kraft.log.snapshot import list_snapshots
from kraft.records import (
    UNFENCE, Batch, BrokerRegistrationChangeRecord, LeaderChangeRecord, PartitionRecord,
    Provenance, RegisterBrokerRecord, RemoveTopicRecord, TopicRecord, ZERO_HASH, batch_hash,
)
from kraft.rpc.server import RpcServer

REPO = Path(__file__).resolve().parent.parent
CLUSTER = "fake-cluster-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll(cond, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if value:
                return value
        except Exception as e:  # not yet
            last = e
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


class FakeController:
    """The controller side of registration, heartbeats and metadata fetches, in one object
    served by any number of RpcServers (all "controllers" share the log)."""

    def __init__(self, snapshot_dir: Path) -> None:
        self.batches: list[tuple[Batch, bytes]] = []
        self.image = MetadataImage.EMPTY
        self.last_hash = ZERO_HASH
        self.log_start = 0
        self.snapshot_dir = snapshot_dir
        self.snapshot: dict | None = None
        self.fetch_offsets: list[int] = []
        self.heartbeats: list[dict] = []
        self.registrations: list[dict] = []
        self.epochs: dict[int, int] = {}
        self.shutdown_ok = True
        self._lock = threading.Lock()

    def append(self, *records) -> int:
        with self._lock:
            batch = Batch(self.image.offset + 1, 1, len(self.batches) + 1, int(time.time() * 1000),
                          Provenance(reason="test"), self.last_hash, tuple(records))
            enc = batch.encode()
            delta = MetadataDelta(self.image)
            delta.replay_batch(batch, batch_hash(enc))
            self.image = delta.apply()
            self.last_hash = batch_hash(enc)
            self.batches.append((batch, enc))
            return batch.base_offset

    def truncate_into_snapshot(self) -> None:
        """Drop the whole log behind a snapshot, as retention would."""
        path = write_checkpoint(self.snapshot_dir, self.image)
        with self._lock:
            self.batches.clear()
            self.log_start = self.image.offset + 1
            self.snapshot = {"name": path.name, "end_offset": self.image.offset + 1,
                             "size": path.stat().st_size}

    async def handle(self, api: str, body: dict, ctx) -> dict:
        if api == "BrokerRegistration":
            if body["cluster_id"] != CLUSTER:
                raise KraftError(ErrorCode.INCONSISTENT_CLUSTER_ID, "wrong cluster")
            self.registrations.append(body)
            bid = body["broker_id"]
            offset = self.image.offset + 1
            self.append(RegisterBrokerRecord(bid, body["incarnation_id"], offset,
                                             tuple(body["listeners"]), (), body.get("rack"), True, False))
            self.epochs[bid] = offset
            return {"broker_epoch": offset}
        if api == "BrokerHeartbeat":
            self.heartbeats.append(body)
            bid = body["broker_id"]
            if self.epochs.get(bid) != body["broker_epoch"]:
                raise KraftError(ErrorCode.STALE_BROKER_EPOCH, "stale")
            reg = self.image.brokers[bid]
            caught_up = body["metadata_offset"] >= body["broker_epoch"]
            if body["want_shutdown"]:
                return {"is_caught_up": caught_up, "is_fenced": reg.fenced,
                        "should_shut_down": self.shutdown_ok}
            if reg.fenced and caught_up and not body["want_fence"]:
                self.append(BrokerRegistrationChangeRecord(bid, body["broker_epoch"], UNFENCE, 0))
            return {"is_caught_up": caught_up, "is_fenced": self.image.brokers[bid].fenced,
                    "should_shut_down": False}
        if api == "FetchMetadata":
            start = body["from_offset"]
            self.fetch_offsets.append(start)
            if start < self.log_start:
                return {"batches": [], "high_watermark": self.image.offset + 1, "snapshot": self.snapshot}
            with trio.move_on_after(body.get("max_wait_ms", 500) / 1000):
                while not any(b.last_offset >= start for b, _ in self.batches):
                    await trio.sleep(0.02)
            out = [enc for b, enc in self.batches if b.last_offset >= start]
            return {"batches": out, "high_watermark": self.image.offset + 1, "snapshot": None}
        if api == "FetchSnapshot":
            data = (self.snapshot_dir / body["name"]).read_bytes()
            pos, n = body["position"], min(body.get("max_bytes") or 1 << 20, 100)  # small chunks
            return {"data": data[pos: pos + n], "size": len(data), "done": pos + n >= len(data)}
        raise KraftError(ErrorCode.UNSUPPORTED_VERSION, api)


class ControllerThread:
    """Serves a FakeController on N ports from a background trio loop; ports can be stopped."""

    def __init__(self, fake: FakeController, n: int) -> None:
        self.fake = fake
        self.ports: list[int] = []
        self.scopes: list[trio.CancelScope] = []
        self._ready = threading.Event()
        self._token = None
        self._n = n
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    async def _serve(self, task_status) -> None:
        with trio.CancelScope() as scope:
            server = RpcServer("127.0.0.1", 0, self.fake.handle)
            async with trio.open_nursery() as n:
                port = await n.start(server.serve)
                task_status.started((port, scope))

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self._root = nursery
            for _ in range(self._n):
                port, scope = await nursery.start(self._serve)
                self.ports.append(port)
                self.scopes.append(scope)
            self._ready.set()

    def stop_port(self, i: int) -> None:
        trio.from_thread.run_sync(self.scopes[i].cancel, trio_token=self._token)

    def stop(self) -> None:
        try:
            trio.from_thread.run_sync(self._root.cancel_scope.cancel, trio_token=self._token)
        except trio.RunFinishedError:
            pass  # every port was already stopped, so the loop has ended
        self._thread.join(10)


class BrokerProcess:
    def __init__(self, tmp: Path, controller_ports: list[int], node_id: int = 1) -> None:
        self.port = free_port()
        self.admin_port = free_port()
        self.config = tmp / f"broker-{node_id}.properties"
        self.log_dir = tmp / f"broker-{node_id}-logs"
        self.log_file = tmp / f"broker-{node_id}.log"
        self.config.write_text("\n".join([
            f"node.id={node_id}", "process.roles=broker", f"cluster.id={CLUSTER}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port}", f"log.dirs={self.log_dir}",
            "controller.quorum.bootstrap.servers=" + ",".join(f"127.0.0.1:{p}" for p in controller_ports),
            f"broker.admin.port={self.admin_port}", "broker.heartbeat.interval.ms=200",
            "broker.session.timeout.ms=3000", "broker.rack=r1",
        ]) + "\n")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.out = open(self.log_file, "ab")
        self.proc = subprocess.Popen([sys.executable, "-c", "import sys; from broker.node import main; "
                                      f"sys.exit(main({str(self.config)!r}))"],
                                     cwd=REPO, env=env, stdout=self.out, stderr=subprocess.STDOUT)

    def state(self) -> dict:
        return describe("127.0.0.1", self.admin_port, timeout=2)

    def terminate(self, timeout: float = 20) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self.out.close()
        return code

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
            self.out.close()

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace")


@pytest.fixture()
def cluster(tmp_path):
    fake = FakeController(tmp_path / "controller-snapshots")
    fake.append(LeaderChangeRecord(3000, 1))
    ct = ControllerThread(fake, 2)
    brokers: list[BrokerProcess] = []
    yield fake, ct, brokers
    for b in brokers:
        b.kill()
    ct.stop()


def running(b: BrokerProcess):
    s = b.state()
    return s if s["state"] == "RUNNING" else None


def test_broker_registers_replays_and_shuts_down(cluster, tmp_path):
    fake, ct, brokers = cluster
    b = BrokerProcess(tmp_path, ct.ports)
    brokers.append(b)
    b.start()
    st = poll(lambda: running(b), what="broker RUNNING")
    assert st["broker_epoch"] == fake.epochs[1]
    assert len(fake.registrations) == 1 and fake.registrations[0]["rack"] == "r1"
    tid = str(uuid.uuid4())
    fake.append(TopicRecord("orders", tid),
                PartitionRecord(0, tid, (1,), (1,), (), (), 1, 0, 0, 0),
                PartitionRecord(1, tid, (2, 1), (2, 1), (), (), 2, 0, 3, 0),
                PartitionRecord(2, tid, (2,), (2,), (), (), 2, 0, 0, 0))
    st = poll(lambda: (s := b.state())["last_applied_offset"] == fake.image.offset and s, what="replay")
    parts = {p["partition"]: p for p in st["partitions"]}
    assert (parts[0]["role"], parts[1]["role"]) == ("leader", "follower")
    assert parts[1]["leader"] == 2 and parts[1]["leader_epoch"] == 3 and 2 not in parts
    assert st["image_checksum"] == fake.image.checksum()
    assert (b.log_dir / "orders-0").is_dir() and (b.log_dir / "orders-1").is_dir()
    # the Kafka listener serves the replayed image
    from confluent_kafka.admin import AdminClient
    md = AdminClient({"bootstrap.servers": f"127.0.0.1:{b.port}"}).list_topics(timeout=10)
    assert md.cluster_id == CLUSTER and list(md.brokers) == [1]
    assert sorted(md.topics["orders"].partitions) == [0, 1, 2]
    # heartbeats report the applied offset
    poll(lambda: fake.heartbeats[-1]["metadata_offset"] == fake.image.offset, what="heartbeat offset")
    # delete the topic: directories go
    fake.append(RemoveTopicRecord(tid))
    poll(lambda: not (b.log_dir / "orders-0").exists() and not b.state()["partitions"], what="delete")
    assert b.terminate() == 0
    assert fake.heartbeats[-1]["want_shutdown"] is True
    assert "controller allowed shutdown" in b.log_text()
    assert list_snapshots(b.log_dir / "metadata")  # checkpointed on shutdown


def test_failover_restart_resume_and_snapshot(cluster, tmp_path):
    fake, ct, brokers = cluster
    b = BrokerProcess(tmp_path, ct.ports)
    brokers.append(b)
    b.start()
    poll(lambda: running(b), what="broker RUNNING")
    # one controller endpoint goes away: the broker keeps fetching and heartbeating via the other
    ct.stop_port(0)
    tid = str(uuid.uuid4())
    fake.append(TopicRecord("t", tid), PartitionRecord(0, tid, (1,), (1,), (), (), 1, 0, 0, 0))
    poll(lambda: b.state()["last_applied_offset"] == fake.image.offset, what="replay after failover")
    n = len(fake.heartbeats)
    poll(lambda: len(fake.heartbeats) > n + 2, what="heartbeats after failover")
    assert len(fake.registrations) == 1  # never double-registered
    assert b.terminate() == 0
    applied = fake.image.offset
    # restart: a new incarnation registers again and resumes from the local checkpoint
    fake.fetch_offsets.clear()
    b.start()
    poll(lambda: running(b), what="restarted broker RUNNING")
    assert len(fake.registrations) == 2
    assert fake.registrations[0]["incarnation_id"] != fake.registrations[1]["incarnation_id"]
    assert fake.fetch_offsets[0] == applied + 1
    assert "loaded metadata checkpoint" in b.log_text()
    assert b.terminate() == 0
    # while it is down, the log moves on and is truncated behind a snapshot
    t2 = str(uuid.uuid4())
    fake.append(TopicRecord("t2", t2), PartitionRecord(0, t2, (1,), (1,), (), (), 1, 0, 0, 0),
                RemoveTopicRecord(tid))
    fake.truncate_into_snapshot()
    # corrupt the newest local checkpoint: it is discarded with a warning, the older one is used
    newest = list_snapshots(b.log_dir / "metadata")[-1]
    raw = bytearray(newest.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    newest.write_bytes(bytes(raw))
    b.start()
    st = poll(lambda: (s := running(b)) and s["last_applied_offset"] == fake.image.offset and s,
              what="snapshot load")
    log_text = b.log_text()
    assert "is corrupt" in log_text and "loading snapshot" in log_text
    assert [p["topic"] for p in st["partitions"]] == ["t2"]
    assert not (b.log_dir / "t-0").exists()  # deleted while down: removed as a stray
    assert st["image_checksum"] == fake.image.checksum()
    assert b.terminate() == 0


def test_wrong_cluster_is_fatal(cluster, tmp_path):
    fake, ct, brokers = cluster
    b = BrokerProcess(tmp_path, ct.ports)
    b.config.write_text(b.config.read_text().replace(f"cluster.id={CLUSTER}", "cluster.id=other"))
    brokers.append(b)
    b.start()
    assert b.proc.wait(30) == 1
    assert "INCONSISTENT_CLUSTER_ID" in b.log_text()
