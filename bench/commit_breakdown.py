"""``python -m bench.commit_breakdown``: where a sequential commit's time goes (issue 24 item 2).

One run on this machine measures the whole and its parts:

* **the whole** — on a real cluster (3 controllers, ``fsync=always``, 3 simulated brokers, as
  ``bench.controller_bench``'s small phase): sequential IncrementalAlterConfigs SET, client to
  client (p50), and a read (DescribeCluster) on the same leader and connection: the controller
  RPC round trip without Raft;
* **the parts**, each alone (p50 of many):
  - ``disk_sync``: a 300-byte append + fdatasync in the cluster's file system (the Raft
    journal's sync, once per entry on the leader and on each follower);
  - ``loopback_rtt``: a 300-byte TCP round trip between two processes (one append_entries and
    its ack; one client request and its answer);
  - ``raft_frame_out`` / ``raft_frame_in``: pykraft's PySyncObj frame of that commit's
    append_entries (pickle + Fernet encryption) and the reading of it (decryption + unpickle),
    through the patched ``TcpConnection`` functions; the ack's the same way;
  - ``propose``: the active controller's ``QuorumStateMachine.propose`` of the command (handler,
    batch encoding, speculative replay);
  - ``apply``: a follower's ``MetadataApplier.apply_entry`` of that batch (decode, chain check,
    replay, log append without sync);
  - ``rpc_frames``: the controller RPC's ``encode_frame`` + ``decode_payload`` of the request and
    of its answer.

The critical path of one commit counts each part as many times as it happens in series (the
leader's journal sync runs while the entry travels to the followers, so only the longer of the
two counts); what the parts do not account for is scheduling on the two shared cores (trio
rounds, poller wake-ups, GIL hand-offs) and PySyncObj's tick work. Prints a markdown table and
a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio

from bench.common import process_cpu_s
from bench.controller_bench import cli, set_body, start_sim_brokers, stop_process

PAYLOAD = 300


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def p50_us(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e6, 1)


def timed(fn: Callable[[], Any], n: int, warmup: int | None = None) -> list[float]:
    """``fn`` run ``n`` times after ``warmup`` untimed runs (default a tenth of ``n``): each
    timed run's seconds."""
    for _ in range(max(1, n // 10) if warmup is None else warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


# ---- parts ---------------------------------------------------------------------------------


def disk_sync(directory: Path, n: int) -> list[float]:
    path = directory / "sync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    block = b"x" * PAYLOAD
    try:

        def one() -> None:
            os.write(fd, block)
            os.fdatasync(fd)

        return timed(one, n)
    finally:
        os.close(fd)
        path.unlink()


_ECHO = """
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
n = int(sys.argv[1])
while True:
    got = b""
    while len(got) < n:
        chunk = c.recv(n - len(got))
        if not chunk:
            sys.exit(0)
        got += chunk
    c.sendall(got)
"""


def loopback_rtt(n: int) -> list[float]:
    echo = subprocess.Popen(
        [sys.executable, "-c", _ECHO, str(PAYLOAD)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert echo.stdout is not None
        port = int(echo.stdout.readline())
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            block = b"y" * PAYLOAD

            def one() -> None:
                s.sendall(block)
                got = 0
                while got < PAYLOAD:
                    got += len(s.recv(PAYLOAD - got))

            return timed(one, n)
    finally:
        echo.kill()
        echo.wait(10)


def _frame_conn(encryptor: Any) -> Any:
    """The attributes of a PySyncObj ``TcpConnection`` that pykraft's frame functions use."""
    conn = SimpleNamespace(
        sendRandKey=b"k" * 32,
        recvRandKey=b"k" * 32,
        encryptor=encryptor,
        recvLastTimestamp=0,
        kraft_authenticated=True,
        kraft_partial_since=None,
    )
    conn._TcpConnection__writeBuffer = bytearray()
    conn._TcpConnection__readBuffer = bytearray()
    conn._TcpConnection__trySendBuffer = lambda: None
    return conn


def raft_frames(raw_batch: bytes, n: int) -> dict[str, list[float]]:
    """Out (encode) and in (decode) of the append_entries carrying ``raw_batch`` and of its ack."""
    import pysyncobj.pickle as ppickle
    from pysyncobj.encryptor import getEncryptor

    from kraft.quorum import pysyncobj_patches as patches

    conn = _frame_conn(getEncryptor("bench-secret-" + uuid.uuid4().hex))
    command = ppickle.dumps((0, ([raw_batch], 5), {}))
    messages = {
        "append": {
            "type": "append_entries",
            "term": 5,
            "commit_index": 1000,
            "entries": [(command, 1001, 5)],
            "prevLogIdx": 1000,
            "prevLogTerm": 5,
        },
        "ack": {"type": "next_node_idx", "next_node_idx": 1002, "reset": False, "success": True},
    }
    out: dict[str, list[float]] = {}
    for name, message in messages.items():
        wbuf = conn._TcpConnection__writeBuffer

        def encode(message: dict[str, Any] = message, wbuf: bytearray = wbuf) -> None:
            wbuf.clear()
            patches._send_message(conn, message)

        out[f"{name}_out"] = timed(encode, n)
        frame = bytes(wbuf)

        def decode(frame: bytes = frame) -> None:
            conn.recvLastTimestamp = 0
            conn._TcpConnection__readBuffer = bytearray(frame)
            assert patches._parse_frame(conn) is not None

        out[f"{name}_in"] = timed(decode, n)
    return out


def state_machine_parts(directory: Path, n: int) -> tuple[dict[str, list[float]], bytes]:
    """``propose`` on a leader's state machine and ``apply_entry`` of each batch on a
    follower's applier (its own log, no sync); one of the batches' bytes."""
    from kraft.controller.commands import Command
    from kraft.controller.settings import ControllerSettings
    from kraft.controller.state_machine import QuorumStateMachine
    from kraft.log.metadata_log import MetadataLog
    from kraft.metadata_applier import APPLIED, MetadataApplier
    from kraft.snapshotter import Snapshotter

    cluster = "breakdown"
    leader = QuorumStateMachine(ControllerSettings(cluster))
    flog = MetadataLog.open(directory / "follower", fsync="never")
    follower = MetadataApplier(
        QuorumStateMachine(ControllerSettings(cluster)),
        flog,
        Snapshotter(directory / "follower", flog, 1 << 40, 0),
    )
    raws: list[bytes] = []
    counter = iter(range(10**9))

    def propose(api: str, body: dict[str, Any]) -> None:
        batch, response, _ = leader.propose(
            Command(api, body, request_id=str(uuid.uuid4()), timestamp_ms=1000, seed=7), 1
        )
        assert batch is not None and leader.last_encoded is not None, response
        raws.append(leader.last_encoded)

    propose("ActivateController", {"leader_id": 1, "term": 1})
    for b in range(3):
        propose(
            "BrokerRegistration",
            {
                "broker_id": b,
                "cluster_id": cluster,
                "incarnation_id": str(uuid.UUID(int=b + 1)),
                "listeners": [],
            },
        )
    for b in range(3):
        reg = leader.image.broker(b)
        assert reg is not None
        propose("UnfenceBroker", {"broker_id": b, "broker_epoch": reg.epoch})
    propose(
        "CreateTopics",
        {"topics": [{"name": "bench-configs", "num_partitions": 1, "replication_factor": 3}]},
    )
    setup = len(raws)
    samples = timed(
        lambda: propose("IncrementalAlterConfigs", set_body("bench-configs", next(counter))), n
    )
    index = iter(range(1, 10**9))
    for raw in raws[:setup]:
        assert follower.apply_entry(next(index), 1, [raw]) == [APPLIED]
    pending = iter(raws[setup:])

    def apply() -> None:
        assert follower.apply_entry(next(index), 1, [next(pending)]) == [APPLIED]

    applied = timed(apply, len(raws) - setup, warmup=0)  # each proposed batch once
    flog.close()
    return {"propose": samples, "apply": applied}, raws[-1]


def rpc_frames(n: int) -> list[float]:
    from kraft.rpc.framing import decode_payload, encode_frame

    request = {"api": "IncrementalAlterConfigs", "id": 7, "body": set_body("bench-configs", 1)}
    answer = {"id": 7, "body": {"responses": [{"error_code": 0, "resource_name": "x"}]}}

    def one() -> None:
        for doc in (request, answer):
            decode_payload(memoryview(encode_frame(doc))[4:])

    return timed(one, n)


# ---- the whole -----------------------------------------------------------------------------


async def _cluster_calls(
    bootstrap: list[tuple[str, int]], seconds: float, pids: dict[str, int]
) -> dict[str, Any]:
    """Sequential writes for ``seconds`` (latencies, and each process's CPU per write), then
    as many reads (DescribeCluster) on the same connection."""
    from kraft.rpc.client import ControllerClient

    client = ControllerClient(bootstrap, client_id="bench-breakdown")
    try:
        await client.call(
            "CreateTopics",
            {"topics": [{"name": "bench-configs", "num_partitions": 1, "replication_factor": 3}]},
            timeout=20,
        )
        value = iter(range(10**9))
        for _ in range(200):  # warm: the connection, the leader's caches
            await client.call(
                "IncrementalAlterConfigs", set_body("bench-configs", next(value)), timeout=10
            )
        writes: list[float] = []
        cpu0 = {name: process_cpu_s(pid) for name, pid in pids.items()}
        stop = time.perf_counter() + seconds
        while time.perf_counter() < stop:
            t = time.perf_counter()
            await client.call(
                "IncrementalAlterConfigs", set_body("bench-configs", next(value)), timeout=10
            )
            writes.append(time.perf_counter() - t)
        cpu = {}
        for name, pid in pids.items():
            (user0, sys0), (user, sys_) = cpu0[name], process_cpu_s(pid)
            cpu[name] = ((user - user0) / len(writes), (sys_ - sys0) / len(writes))
        reads: list[float] = []
        for _ in range(len(writes)):
            t = time.perf_counter()
            await client.call("DescribeCluster", {}, timeout=10)
            reads.append(time.perf_counter() - t)
        return {"write": writes, "read": reads, "cpu_per_write_s": cpu}
    finally:
        await client.aclose()


def whole(seconds: float) -> dict[str, Any]:
    from kraft.rpc.client import call_sync

    directory = Path(tempfile.mkdtemp(prefix="pykraft-breakdown-"))
    log(f"starting 3 controllers (fsync always) + 3 simulated brokers in {directory}")
    r = cli(
        "cluster", "up", "--no-auth", "--dir", str(directory), "--controllers", "3",
        "--detach", "--fsync", "always", timeout=120,
    )  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"cluster up failed: {r.stderr.strip()[-500:]}")
    try:
        sims = start_sim_brokers(directory, 3)
        try:
            meta = json.loads((directory / "cluster.json").read_text())
            bootstrap = [(c["host"], c["rpc_port"]) for c in meta["controllers"]]
            leader = call_sync(bootstrap, "DescribeQuorum", {}, timeout=10)["leader_id"]
            pids = {"client": os.getpid(), "simulated_brokers": sims.pid}
            for c in meta["controllers"]:
                role = "leader" if c["id"] == leader else f"follower_{c['id']}"
                pids[role] = int(c["pid"])
            log(f"sequential writes for {seconds:.0f} s, then as many reads")
            result: dict[str, Any] = trio.run(_cluster_calls, bootstrap, seconds, pids)
            return result
        finally:
            stop_process(sims)
    finally:
        cli("cluster", "down", "--dir", str(directory), timeout=90)


# ---- the breakdown -------------------------------------------------------------------------


def run(seconds: float = 10.0, n: int = 2000) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="pykraft-breakdown-parts-"))
    log("parts: disk sync, loopback round trip, Raft frames, state machine, RPC frames")
    parts: dict[str, list[float]] = {"disk_sync": disk_sync(work, n // 4)}
    parts["loopback_rtt"] = loopback_rtt(n)
    sm, raw = state_machine_parts(work, n)
    parts.update(sm)
    frames = raft_frames(raw, n)
    parts.update({f"raft_{k}": v for k, v in frames.items()})
    parts["rpc_frames"] = rpc_frames(n)
    calls = whole(seconds)
    us = {k: p50_us(v) for k, v in parts.items()}
    write_us, read_us = p50_us(calls["write"]), p50_us(calls["read"])
    # The leader encodes the entry for each of two followers, reads their acks; the first
    # follower to answer decodes it, syncs, encodes its ack. The leader's own sync overlaps.
    raft_us = (
        us["raft_append_out"]
        + max(
            us["disk_sync"],
            us["raft_append_out"] + us["loopback_rtt"] + us["raft_append_in"] + us["disk_sync"]
            + us["raft_ack_out"] + us["raft_ack_in"],
        )
        + us["raft_ack_in"]
    )  # fmt: skip
    path = [
        ("client <-> leader: round trip + RPC frames", us["loopback_rtt"] + us["rpc_frames"]),
        ("propose (handler, batch, speculative replay)", us["propose"]),
        ("Raft: frames, round trip, follower's sync (leader's overlaps)", raft_us),
        ("apply on the leader (adopt + log append; a follower's full apply)", us["apply"]),
    ]
    accounted = sum(v for _, v in path)
    return {
        "system": "pykraft",
        "bench": "commit_breakdown",
        "parts_us_p50": us,
        "whole": {
            "sequential_write_p50_us": write_us,
            "read_round_trip_p50_us": read_us,
            "writes": len(calls["write"]),
            "cpu_us_per_write": {  # user, system
                k: [round(u * 1e6, 1), round(s * 1e6, 1)]
                for k, (u, s) in sorted(calls["cpu_per_write_s"].items())
            },
        },
        "critical_path_us": [{"step": s, "us": round(v, 1)} for s, v in path],
        "accounted_us": round(accounted, 1),
        "unaccounted_us": round(write_us - accounted, 1),
    }


def table(result: dict[str, Any]) -> str:
    lines = ["| part (alone) | p50 us |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in result["parts_us_p50"].items()]
    w = result["whole"]
    lines += [
        "",
        "| one sequential commit, critical path | us |",
        "| --- | --- |",
    ]
    lines += [f"| {p['step']} | {p['us']} |" for p in result["critical_path_us"]]
    lines += [
        f"| accounted | {result['accounted_us']} |",
        f"| measured (client p50, {w['writes']} writes) | {w['sequential_write_p50_us']} |",
        f"| not accounted (scheduling, ticks, the rest) | {result['unaccounted_us']} |",
        f"| a read on the same connection (no Raft) | {w['read_round_trip_p50_us']} |",
        "",
        "| process | CPU us per sequential write: user | system |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {k} | {u} | {s} |" for k, (u, s) in w["cpu_us_per_write"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=10.0, help="sequential writes on the cluster")
    ap.add_argument("--n", type=int, default=2000, help="repetitions of each part")
    a = ap.parse_args(argv)
    result = run(a.seconds, a.n)
    print(table(result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
