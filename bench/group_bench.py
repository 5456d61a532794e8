"""Group coordinator benchmark: a real cluster (3 controllers, 3 brokers), ``__consumer_offsets``
with replication factor 3.

Measures (progress on stderr):
  1. offset commits/s, each answered only once replicated to the ISR (acks=all): one client
     committing one partition at a time (p50/p99 latency), and 8 clients at once (raw
     OffsetCommit v8 simple commits over the Kafka protocol, one connection each);
  2. rebalance time for 10 members (confluent-kafka consumers): from the subscribe of all ten to
     every member holding its partitions, then the rebalance when an 11th joins.

``main()`` prints a markdown table and, as the last stdout line, a JSON document of the rows.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import kraft, logger  # noqa: E402  (after the path set-up, run as a script)

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


def commit_loop(address: tuple[str, int], group: str, seconds: float) -> list[float]:
    """Simple commits (generation -1) of topic 'bench' partition 0 for ``seconds``."""
    from tools.kafka_wire import KafkaWire

    latencies = []
    with KafkaWire(*address, timeout=30) as w:
        offset = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            offset += 1
            t0 = time.perf_counter()
            resp = w.call(
                8,
                8,
                {
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
                                    "committed_offset": offset,
                                    "committed_leader_epoch": -1,
                                    "committed_metadata": "",
                                }
                            ],
                        }
                    ],
                },
            )
            latencies.append(time.perf_counter() - t0)
            code = resp.topics[0].partitions[0].error_code.value
            if code != 0:
                raise RuntimeError(f"commit failed: error {code}")
    return latencies


def bench_commits(brokers: list[tuple[str, int]], seconds: float) -> list[dict[str, Any]]:
    rows = []
    lat = commit_loop(coordinator(brokers, "bench-seq"), "bench-seq", seconds)
    rows.append(
        {
            "metric": "offset commits/s, 1 client, acks=all RF 3",
            "value": f"{len(lat) / seconds:.0f}/s",
            "detail": f"p50 {pct(lat, 50) * 1000:.1f} ms, p99 {pct(lat, 99) * 1000:.1f} ms",
        }
    )
    results: list[list[float]] = []
    groups = [f"bench-par-{i}" for i in range(8)]
    addresses = [coordinator(brokers, g) for g in groups]

    def run(i: int) -> None:
        results.append(commit_loop(addresses[i], groups[i], seconds))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(len(r) for r in results)
    every = [x for r in results for x in r]
    rows.append(
        {
            "metric": "offset commits/s, 8 clients (8 groups), acks=all RF 3",
            "value": f"{total / seconds:.0f}/s",
            "detail": f"p50 {pct(every, 50) * 1000:.1f} ms, p99 {pct(every, 99) * 1000:.1f} ms",
        }
    )
    return rows


def bench_rebalance(servers: str, members: int = 10) -> list[dict[str, Any]]:
    from confluent_kafka import Consumer

    def consumer(i: int) -> Any:
        c = Consumer(
            {
                "bootstrap.servers": servers,
                "group.id": "bench-rebalance",
                "client.id": f"m{i}",
                "session.timeout.ms": 30000,
                "partition.assignment.strategy": "range",
            }
        )
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
    return [
        {
            "metric": f"first assignment of {members} members (20 partitions)",
            "value": f"{first:.2f} s",
            "detail": "subscribe of all to every member assigned",
        },
        {
            "metric": f"rebalance when member {members + 1} joins",
            "value": f"{again:.2f} s",
            "detail": "join to every member assigned again",
        },
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="per commit measurement")
    args = ap.parse_args()
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
        rows = bench_commits(brokers, args.seconds) + bench_rebalance(servers)
    finally:
        kraft("cluster", "down", "--dir", cluster, "--timeout", "20", timeout=120)
        shutil.rmtree(workdir, ignore_errors=True)
    print("| metric | value | detail |\n| --- | --- | --- |")
    for r in rows:
        print(f"| {r['metric']} | {r['value']} | {r['detail']} |")
    print(json.dumps({"system": "pykraft", "results": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
