"""Group coordinator benchmark: a real cluster (3 controllers, 3 brokers), ``__consumer_offsets``
with replication factor 3.

Measures (progress on stderr):
  1. offset commits/s, each answered only once replicated to the ISR (acks=all): one client
     committing one partition at a time (p50/p99 latency), then 8 and 64 clients at once (raw
     OffsetCommit v8 simple commits over the Kafka protocol, one connection and one group each,
     one commit in flight per connection; ``--clients``); afterwards every group's committed
     offset is read back with OffsetFetch and must be its client's last commit;
  2. rebalance time for 10 members (confluent-kafka consumers): from the subscribe of all ten to
     every member holding its partitions, then the rebalance when an 11th joins; once with
     librdkafka's default heartbeat interval (3 s, most of the figure) and once with 100 ms,
     which carries the <= 1 s target.

``main()`` prints a markdown table and, as the last stdout line, a JSON document of the rows.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import kraft, logger, total_cpu_s  # noqa: E402  (after the path set-up, run as a script)

log = logger()


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(p / 100 * len(ordered))) - 1))]


def coordinator(brokers: list[tuple[str, int]], group: str) -> tuple[str, int]:
    from tools.kafka_wire import KafkaWire

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with KafkaWire(*brokers[0]) as w:
            c = w.call(10, 4, {"key_type": 0, "coordinator_keys": [group]}).coordinators[0]
        if c.error_code.value == 0:
            return c.host, c.port
        time.sleep(0.2)
    raise RuntimeError(f"no coordinator for {group}")


SENTINEL_OFFSET = 0x0123456789ABCDEF
SENTINEL_CORRELATION = 0x13572468


def commit_template(group: str) -> tuple[bytes, int, int]:
    """An OffsetCommit v8 frame (simple commit of 'bench' partition 0) and the positions of its
    correlation id and committed offset, so a client patches bytes instead of encoding each."""
    import io

    from kio.index import load_request_schema
    from kio.serial import entity_writer

    from broker.protocol.kafka_admin import build_entity

    cls = load_request_schema(8, 8)
    buf = io.BytesIO()
    head = cls.__header_schema__
    entity_writer(head)(
        buf,
        build_entity(
            head,
            {
                "request_api_key": 8,
                "request_api_version": 8,
                "correlation_id": SENTINEL_CORRELATION,
                "client_id": "group-bench",
            },
        ),
    )
    body = {
        "group_id": group,
        "generation_id_or_member_epoch": -1,
        "member_id": "",
        "group_instance_id": None,
        "topics": [
            {
                "name": "bench",
                "partitions": [
                    {
                        "partition_index": 0,
                        "committed_offset": SENTINEL_OFFSET,
                        "committed_leader_epoch": -1,
                        "committed_metadata": "",
                    }
                ],
            }
        ],
    }
    entity_writer(cls)(buf, build_entity(cls, body))
    data = struct.pack(">i", len(buf.getvalue())) + buf.getvalue()
    corr = data.index(struct.pack(">i", SENTINEL_CORRELATION))
    off = data.index(struct.pack(">q", SENTINEL_OFFSET))
    return data, corr, off


def commit_error(frame: bytes) -> int:
    """The error code of the single partition of an OffsetCommit v8 response frame (after the
    size): correlation id, header tags, throttle, topics (1), name, partitions (1), index, error."""
    pos = 4 + 1 + 4 + 1  # correlation, empty header tags, throttle time, compact array length 2
    name_len = frame[pos] - 1
    pos += 1 + name_len + 1 + 4  # name, partitions length, partition index
    return int(struct.unpack_from(">h", frame, pos)[0])


class _Client:
    """One connection with one OffsetCommit in flight at a time (Kafka serves a connection's
    requests in order), driven by :func:`commit_clients`' selector."""

    def __init__(self, address: tuple[str, int], group: str) -> None:
        self.sock = socket.create_connection(address, timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.template = bytearray(commit_template(group)[0])
        _, self.corr_at, self.off_at = commit_template(group)
        self.offset = 0
        self.sent_at = 0.0
        self.buf = bytearray()
        self.latencies: list[float] = []

    def send(self) -> None:
        self.offset += 1
        struct.pack_into(">i", self.template, self.corr_at, self.offset & 0x7FFFFFFF)
        struct.pack_into(">q", self.template, self.off_at, self.offset)
        self.sent_at = time.perf_counter()
        self.sock.setblocking(True)
        self.sock.sendall(self.template)
        self.sock.setblocking(False)

    def receive(self) -> bool:
        """Read what arrived; True once the whole response is in (its error checked)."""
        chunk = self.sock.recv(65536)
        if not chunk:
            raise RuntimeError("the coordinator closed the connection")
        self.buf += chunk
        if len(self.buf) < 4:
            return False
        (size,) = struct.unpack_from(">i", self.buf)
        if len(self.buf) < 4 + size:
            return False
        frame = bytes(self.buf[4 : 4 + size])
        del self.buf[: 4 + size]
        self.latencies.append(time.perf_counter() - self.sent_at)
        code = commit_error(frame)
        if code != 0:
            raise RuntimeError(f"commit failed: error {code}")
        return True


def commit_clients(
    addresses: list[tuple[str, int]], groups: list[str], seconds: float
) -> list[float]:
    """Clients ``i`` commit for group ``groups[i]`` at ``addresses[i]``, each one commit at a time,
    for ``seconds``; every commit's latency. Then each group's committed offset is read back
    (OffsetFetch) and must be the last one its client committed: an answered commit that did not
    land would fail the run."""
    import selectors

    clients = [_Client(a, g) for a, g in zip(addresses, groups, strict=True)]
    sel = selectors.DefaultSelector()
    try:
        for c in clients:
            sel.register(c.sock, selectors.EVENT_READ, c)
            c.send()
        end = time.monotonic() + seconds
        live = len(clients)
        while live:
            for key, _ in sel.select(timeout=1.0):
                c = key.data
                if c.receive():
                    if time.monotonic() < end:
                        c.send()
                    else:
                        sel.unregister(c.sock)
                        live -= 1
    finally:
        sel.close()
        for c in clients:
            c.sock.close()
    from tools.group_admin import committed
    from tools.kafka_wire import KafkaWire

    for a, g, c in zip(addresses, groups, clients, strict=True):
        with KafkaWire(*a) as w:
            got = committed(w, g).get(("bench", 0), -1)
        if got != c.offset:
            raise RuntimeError(f"{g}: OffsetFetch answers {got}, its last commit was {c.offset}")
    return [x for c in clients for x in c.latencies]


def bench_commits(
    brokers: list[tuple[str, int]], seconds: float, parallel: list[int], pids: list[int]
) -> list[dict[str, Any]]:
    """Commit rows; each also gives the brokers' CPU per commit, which the machine's load
    changes far less than the rate."""
    rows = []
    cpu0 = total_cpu_s(pids)
    lat = commit_clients([coordinator(brokers, "bench-seq")], ["bench-seq"], seconds)
    cpu = total_cpu_s(pids) - cpu0
    rows.append(
        {
            "key": "commits_seq",
            "metric": "offset commits/s, 1 client, acks=all RF 3",
            "rate": round(len(lat) / seconds, 1),
            "value": f"{len(lat) / seconds:.0f}/s",
            "detail": f"p50 {pct(lat, 50) * 1000:.1f} ms, p99 {pct(lat, 99) * 1000:.1f} ms, "
            f"broker CPU {cpu / len(lat) * 1e6:.0f} us/commit",
        }
    )
    for n in parallel:
        groups = [f"bench-par-{i}" for i in range(n)]
        addresses = [coordinator(brokers, g) for g in groups]
        cpu0 = total_cpu_s(pids)
        every = commit_clients(addresses, groups, seconds)
        cpu = total_cpu_s(pids) - cpu0
        rows.append(
            {
                "key": "commits_parallel" if n == 8 else f"commits_parallel_{n}",
                "metric": f"offset commits/s, {n} clients ({n} groups), acks=all RF 3",
                "rate": round(len(every) / seconds, 1),
                "value": f"{len(every) / seconds:.0f}/s",
                "detail": f"p50 {pct(every, 50) * 1000:.1f} ms, "
                f"p99 {pct(every, 99) * 1000:.1f} ms, "
                f"broker CPU {cpu / len(every) * 1e6:.0f} us/commit",
            }
        )
        log(f"{n} clients: {rows[-1]['value']} ({rows[-1]['detail']})")
    return rows


def bench_rebalance(
    servers: str, members: int = 10, heartbeat_ms: int | None = None
) -> list[dict[str, Any]]:
    """``members`` confluent-kafka consumers subscribe to 'bench', then one more joins: seconds
    to every member assigned, each time. A Stable member learns of a rebalance from its next
    heartbeat's REBALANCE_IN_PROGRESS (as in Kafka), so with librdkafka's default
    ``heartbeat.interval.ms`` (3 s) that interval is most of the figure; ``heartbeat_ms`` sets it,
    and names the rows' keys and metrics after it."""
    from confluent_kafka import Consumer

    group = "bench-rebalance" + (f"-hb{heartbeat_ms}" if heartbeat_ms else "")

    def consumer(i: int) -> Any:
        conf = {
            "bootstrap.servers": servers,
            "group.id": group,
            "client.id": f"m{i}",
            "session.timeout.ms": 30000,
            "partition.assignment.strategy": "range",
        }
        if heartbeat_ms:
            conf["heartbeat.interval.ms"] = heartbeat_ms
        c = Consumer(conf)
        c.subscribe(["bench"])
        return c

    def settle(cs: list[Any], deadline_s: float = 120) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < deadline_s:
            for c in cs:
                c.poll(0.01)
            owned = [len(c.assignment()) for c in cs]
            if all(owned) and sum(owned) == 20:
                return time.monotonic() - t0
        raise RuntimeError("the group did not settle")

    consumers = [consumer(i) for i in range(members)]
    try:
        first = settle(consumers)
        log(f"{members} members assigned after {first:.2f} s")
        consumers.append(consumer(members))
        again = settle(consumers)
        log(f"rebalance to {members + 1} members took {again:.2f} s")
    finally:
        for c in consumers:
            c.close()
    suffix = f"_hb{heartbeat_ms}" if heartbeat_ms else ""
    beat = f"heartbeat.interval.ms {heartbeat_ms}" if heartbeat_ms else "librdkafka's defaults"
    return [
        {
            "key": "first_assignment" + suffix,
            "metric": f"first assignment of {members} members (20 partitions), {beat}",
            "seconds": round(first, 3),
            "value": f"{first:.2f} s",
            "detail": "subscribe of all to every member assigned",
        },
        {
            "key": "rebalance" + suffix,
            "metric": f"rebalance when member {members + 1} joins, {beat}",
            "seconds": round(again, 3),
            "value": f"{again:.2f} s",
            "detail": "its subscribe to every member assigned again",
        },
    ]


COMMIT_TARGET_S = 5000.0
REBALANCE_TARGET_S = 1.0
#: the members' heartbeat interval in the rebalance row that carries the target
REBALANCE_HEARTBEAT_MS = 100


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 21's targets: offset commits/s (acks=all, RF 3) and a 10-member rebalance."""
    by = {r["key"]: r for r in rows}
    out = []
    parallel = [r for k, r in by.items() if k.startswith("commits_parallel")]
    if parallel:
        best = max(parallel, key=lambda r: r["rate"])
        rate = best["rate"]
        out.append(
            {
                "target": f"offset commits/s, acks=all RF 3 >= 5,000 ({best['metric']})",
                "value": rate,
                "limit": COMMIT_TARGET_S,
                "ratio": round(rate / COMMIT_TARGET_S, 3),
                "met": rate >= COMMIT_TARGET_S,
            }
        )
    key = f"rebalance_hb{REBALANCE_HEARTBEAT_MS}"
    if key in by:  # members that heartbeat often: the coordinator's rebalance, not the client's
        secs = by[key]["seconds"]  # timer (the target counts from the last JoinGroup)
        out.append(
            {
                "target": "rebalance when an 11th member joins a 10-member group <= 1 s "
                f"(heartbeat.interval.ms {REBALANCE_HEARTBEAT_MS})",
                "value": secs,
                "limit": REBALANCE_TARGET_S,
                "ratio": round(secs / REBALANCE_TARGET_S, 3),
                "met": secs <= REBALANCE_TARGET_S,
            }
        )
    return out


def run(
    seconds: float = 10.0, parallel: tuple[int, ...] = (8, 64), rebalance: bool = True
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A 3+3 cluster (fsync never), the commit and rebalance measurements: (rows, targets)."""
    workdir = Path(tempfile.mkdtemp(prefix="group-bench-"))
    cluster = str(workdir / "c")
    try:
        log("starting 3 controllers + 3 brokers")
        kraft(
            "cluster", "up", "--dir", cluster, "--controllers", "3", "--brokers", "3",
            "--fsync", "never", "--detach", timeout=180,
        )  # fmt: skip
        kraft(
            "topics", "create", "bench", "--partitions", "20", "--replication-factor", "3",
            "--cluster", cluster,
        )  # fmt: skip
        meta = json.loads((workdir / "c" / "cluster.json").read_text())
        brokers = [(b["host"], b["port"]) for b in meta["brokers"]]
        servers = ",".join(f"{h}:{p}" for h, p in brokers)
        pids = [b["pid"] for b in meta["brokers"]]
        rows = bench_commits(brokers, seconds, list(parallel), pids)
        if rebalance:
            rows += bench_rebalance(servers)
            rows += bench_rebalance(servers, heartbeat_ms=REBALANCE_HEARTBEAT_MS)
    finally:
        kraft("cluster", "down", "--dir", cluster, "--timeout", "20", timeout=120)
        shutil.rmtree(workdir, ignore_errors=True)
    return rows, targets(rows)


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| metric | value | detail |", "| --- | --- | --- |"]
    lines += [f"| {r['metric']} | {r['value']} | {r['detail']} |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="per commit measurement")
    ap.add_argument(
        "--clients",
        default="8,64",
        help="comma-separated client counts for the parallel commit rows (8,64)",
    )
    ap.add_argument("--no-rebalance", action="store_true", help="commit measurements only")
    args = ap.parse_args()
    counts = tuple(int(n) for n in args.clients.split(",") if n.strip())
    rows, goals = run(args.seconds, counts, not args.no_rebalance)
    print(table(rows))
    print(json.dumps({"system": "pykraft", "results": rows, "targets": goals}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
