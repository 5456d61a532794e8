"""`make demo`: the pykraft story in a few minutes, driven entirely through the `kraft` CLI.

Starts a 3-controller / 3-broker cluster in ./demo-cluster, creates topics, runs a consumer
group and a transactional producer, crashes the active controller and a partition leader,
watches the cluster heal, audits the metadata log with Spark, and always stops every node it
started on the way out (also on Ctrl-C or failure).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DIR = "demo-cluster"
CLUSTER = ["--cluster", DIR]


class DemoError(Exception):
    """A step of the demo did not go as expected."""


def banner(title: str) -> None:
    """Print a section heading."""
    print(f"\n=== {title} ===", flush=True)


def kraft(*args: str, timeout: float = 30, quiet: bool = False, check: bool = True) -> str:
    """Run `kraft ARGS` as a subprocess, echoing the command and (unless quiet) its output."""
    if not quiet:
        print(f"$ kraft {' '.join(args)}", flush=True)
    proc = subprocess.run(
        [sys.executable, "-m", "tools.cli", *args], capture_output=True, text=True, timeout=timeout
    )
    if not quiet:
        print(proc.stdout.rstrip() or proc.stderr.rstrip(), flush=True)
    if check and proc.returncode != 0:
        raise DemoError(f"kraft {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def kraft_json(*args: str) -> Any:
    """Run a read-only `kraft ... --json` quietly; None if it fails (e.g. during a failover)."""
    try:
        out = kraft(*args, "--json", "--timeout", "3", timeout=15, quiet=True, check=False)
        return json.loads(out)
    except (subprocess.TimeoutExpired, json.JSONDecodeError):
        return None


def poll(what: str, check: Callable[[], Any], deadline_s: float = 60) -> Any:
    """Call check() until it returns something truthy, printing progress; fail after the deadline."""
    start = time.monotonic()
    last = 0.0
    while time.monotonic() - start < deadline_s:
        result = check()
        if result:
            print(f"   ... {what}: done after {time.monotonic() - start:.1f}s", flush=True)
            return result
        if time.monotonic() - last >= 2:
            print(f"   ... waiting for {what} ({time.monotonic() - start:.0f}s)", flush=True)
            last = time.monotonic()
        time.sleep(0.5)
    raise DemoError(f"timed out after {deadline_s:.0f}s waiting for {what}")


def leader_id() -> int | None:
    """The active controller per `kraft quorum status`, or None while there is none."""
    status = kraft_json("quorum", "status", *CLUSTER)
    lid = status.get("leader_id") if isinstance(status, dict) else None
    return lid if isinstance(lid, int) and lid >= 0 else None  # -1: no leader known yet


def broker_states() -> dict[int, str]:
    """broker_id -> state (fenced/unfenced/...) per `kraft cluster describe`."""
    desc = kraft_json("cluster", "describe", *CLUSTER)
    return {b["broker_id"]: b["state"] for b in desc.get("brokers", [])} if desc else {}


def leaders() -> dict[tuple[str, int], int]:
    """(topic, partition) -> leader (-1/None when offline) per `kraft topics describe`."""
    desc = kraft_json("topics", "describe", *CLUSTER)
    if not desc:
        return {}
    return {
        (t["name"], p["partition"]): p["leader"] for t in desc["topics"] for p in t["partitions"]
    }


def start_cluster() -> None:
    """Step 1: a fresh 3+3 cluster on racks r1..r3."""
    banner("1. Start 3 controllers + 3 brokers on racks r1,r2,r3")
    if Path(DIR).exists():
        print(f"(removing the previous {DIR}/)")
        kraft("cluster", "down", "--dir", DIR, timeout=90, quiet=True, check=False)
        shutil.rmtree(DIR)
    kraft(
        "cluster",
        "up",
        "--dir",
        DIR,
        "--controllers",
        "3",
        "--brokers",
        "3",
        "--racks",
        "r1,r2,r3",
        "--metrics",
        "--detach",
        timeout=120,
    )


def create_topics() -> None:
    """Step 2: quorum status, three topics, describe."""
    banner("2. The Raft quorum and some topics")
    kraft("quorum", "status", *CLUSTER)
    kraft("topics", "create", "orders", "--partitions", "6", "--replication-factor", "3", *CLUSTER)
    kraft(
        "topics",
        "create",
        "payments",
        "--partitions",
        "3",
        "--replication-factor",
        "3",
        "--config",
        "retention.ms=86400000",
        "--config",
        "min.insync.replicas=2",
        *CLUSTER,
    )
    kraft(
        "topics", "create", "audit-log", "--partitions", "1", "--replication-factor", "1", *CLUSTER
    )
    kraft("topics", "describe", *CLUSTER)
    print("Brokers 101/102/103 sit on racks r1/r2/r3, so every RF-3 partition spans all racks.")


def consumer_group() -> None:
    """Step 3: two consumers in one group split orders; one leaves; describe with lag."""
    from confluent_kafka import Consumer, Producer

    banner("3. Two consumers in one group split a topic")
    info = json.loads(Path(DIR, "cluster.json").read_text())
    servers = ",".join(f"{b['host']}:{b['port']}" for b in info["brokers"])
    producer = Producer({"bootstrap.servers": servers, "acks": "all"})
    for i in range(600):
        producer.produce("orders", f"order-{i}".encode(), key=str(i).encode())
    if producer.flush(30):
        raise DemoError("could not produce to orders")
    print("Produced 600 records to orders (6 partitions); app-1 and app-2 join group orders-app.")
    conf = {
        "bootstrap.servers": servers,
        "group.id": "orders-app",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "partition.assignment.strategy": "range",
    }
    apps = {name: Consumer(dict(conf, **{"client.id": name})) for name in ("app-1", "app-2")}
    read = dict.fromkeys(apps, 0)
    try:
        for c in apps.values():
            c.subscribe(["orders"])

        def consume(limit: int) -> None:
            for name, c in apps.items():
                if read[name] < limit:
                    read[name] += sum(m.error() is None for m in c.consume(20, 0.2))

        def split() -> bool:
            consume(150)
            owned = [len(c.assignment()) for c in apps.values()]
            return all(owned) and sum(owned) == 6

        poll("both members assigned 3 partitions each", split, 60)

        def halfway() -> bool:
            consume(150)
            return min(read.values()) >= 150

        poll("each app reading 150 records", halfway)
        for c in apps.values():
            commit(c)
        kraft("groups", "describe", "orders-app", *CLUSTER)
        print("app-2 leaves (LeaveGroup): the group rebalances and app-1 takes every partition.")
        apps.pop("app-2").close()

        def taken_over() -> bool:
            consume(10**6)
            return len(apps["app-1"].assignment()) == 6

        poll("app-1 owning all 6 partitions", taken_over, 60)
        app1 = apps["app-1"]

        def caught_up() -> bool:
            consume(10**6)
            assigned = app1.assignment()
            committed = {(tp.topic, tp.partition): tp.offset for tp in app1.committed(assigned, 5)}
            return len(assigned) == 6 and all(
                max(tp.offset, committed[(tp.topic, tp.partition)])
                >= app1.get_watermark_offsets(tp, 5)[1]
                for tp in app1.position(assigned)
            )

        poll("app-1 reading every partition to its end", caught_up, 60)
        commit(app1)
        kraft("groups", "describe", "orders-app", *CLUSTER)
    finally:
        for c in apps.values():
            c.close()


def transactions() -> None:
    """Step 4: a transactional producer commits one transaction and aborts another; a
    read_committed consumer sees only the committed records."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    banner("4. Exactly once: one transaction commits, another aborts")
    info = json.loads(Path(DIR, "cluster.json").read_text())
    servers = ",".join(f"{b['host']}:{b['port']}" for b in info["brokers"])
    producer = Producer({"bootstrap.servers": servers, "transactional.id": "payments-writer"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce("payments", f"paid-{i}".encode(), key=str(i).encode())
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce("payments", f"refund-{i}".encode(), key=str(i).encode())
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()  # a last committed record per partition shows where reading ends
    for p in range(3):
        producer.produce("payments", b"settled", partition=p)
    producer.commit_transaction(30)
    print("payments-writer committed paid-0..2, wrote refund-0..2 and aborted, then committed")
    print("a 'settled' record in each partition.")
    kraft("transactions", "describe", "--transactional-id", "payments-writer", *CLUSTER)
    reader = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": "payments-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        reader.assign([TopicPartition("payments", p, OFFSET_BEGINNING) for p in range(3)])
        seen: list[str] = []

        def settled() -> bool:
            for m in reader.consume(20, 0.2):
                if m.error() is None:
                    seen.append((m.value() or b"").decode())
            return seen.count("settled") == 3

        poll("a read_committed consumer reading up to every 'settled' record", settled, 60)
        paid = sorted(v for v in seen if v != "settled")
        print(f"The read_committed consumer saw: {', '.join(paid)}")
        if paid != [f"paid-{i}" for i in range(3)]:
            raise DemoError(f"read_committed saw {paid}, not exactly paid-0..2")
    finally:
        reader.close()


def commit(consumer: Any) -> None:
    """Commit what the consumer has read; having read nothing new since the last commit is fine."""
    from confluent_kafka import KafkaError, KafkaException

    try:
        consumer.commit(asynchronous=False)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError._NO_OFFSET:
            raise


def controller_failover() -> None:
    """Step 5: crash the active controller and watch a new one take over."""
    banner("5. Crash the active controller")
    old = poll("a quorum leader", leader_id)
    kraft("cluster", "kill", "--dir", DIR, "--node", str(old), "--signal", "KILL")
    new = poll("a new active controller", lambda: (lid := leader_id()) not in (None, old) and lid)
    print(f"Active controller: {old} -> {new}")
    kraft("cluster", "start", "--dir", DIR, "--node", str(old), "--wait", timeout=90)
    kraft("quorum", "status", *CLUSTER)
    kraft("quorum", "replication", *CLUSTER)
    show_active_controller_metric()


def show_active_controller_metric() -> None:
    """Each controller's Prometheus ActiveControllerCount (exactly one says 1)."""
    from urllib.request import urlopen

    info = json.loads(Path(DIR, "cluster.json").read_text())
    for c in info["controllers"]:
        url = f"http://{c['host']}:{c['metrics_port']}/metrics"
        try:
            with urlopen(url, timeout=5) as resp:
                text = resp.read().decode()
        except OSError as exc:
            raise DemoError(f"cannot scrape {url}: {exc}") from None
        value = next(
            (
                line.split()[1]
                for line in text.splitlines()
                if line.startswith("kafka_controller_kafkacontroller_activecontrollercount ")
            ),
            "?",
        )
        print(f"   controller {c['id']} {url}: ActiveControllerCount {value}")


def broker_failover() -> None:
    """Step 6: crash the leader of orders-0; fencing, leader moves, restart, unfencing."""
    banner("6. Crash the broker leading orders partition 0")
    before = poll("partition leaders", leaders)
    victim = before[("orders", 0)]
    led = sorted(tp for tp, leader in before.items() if leader == victim)
    print(f"Broker {victim} leads: {', '.join(f'{t}-{p}' for t, p in led)}")
    kraft("cluster", "kill", "--dir", DIR, "--node", str(victim), "--signal", "KILL")
    print("The controller fences it once its session (9 s) expires without a heartbeat.")
    poll(f"broker {victim} fenced", lambda: broker_states().get(victim) == "fenced", 45)

    def moved() -> dict[tuple[str, int], int] | None:
        now = leaders()
        return now if now and all(now.get(tp) != victim for tp in led) else None

    after = poll("new partition leaders", moved, 30)
    for tp in led:
        new = after[tp]
        shown = new if new not in (None, -1) else "none (offline: no other replica)"
        print(f"   {tp[0]}-{tp[1]}: {victim} -> {shown}")
    kraft("cluster", "describe", *CLUSTER)
    kraft("topics", "describe", *CLUSTER)
    kraft("cluster", "start", "--dir", DIR, "--node", str(victim))
    poll(f"broker {victim} unfenced", lambda: broker_states().get(victim) == "unfenced", 60)
    kraft("cluster", "describe", *CLUSTER)


def epilogue() -> None:
    """Step 7: audit a controller's metadata log with Spark; where the metadata logs live."""
    banner("7. Audit the metadata log with Spark")
    info = json.loads(Path(DIR, "cluster.json").read_text())
    log_dir = str(Path(info["controllers"][0]["metadata_dir"]) / "log")
    kraft(
        "audit", "--log-dir", log_dir, "--out", f"{DIR}/audit", "--master", "local[2]", timeout=900
    )
    print(
        f"Open {DIR}/audit/report.html: leadership timeline, fenced intervals, ISR sizes, "
        "who changed what, and every check."
    )
    print("The replicated metadata log of each controller:")
    for c in info["controllers"]:
        print(f"   controller {c['id']}: {c['metadata_dir']}")


def main() -> int:
    """Run the demo; always stop the cluster. Exit 0 on success, 1 on failure, 130 on Ctrl-C."""
    started = time.monotonic()
    code = 0
    try:
        start_cluster()
        create_topics()
        consumer_group()
        transactions()
        controller_failover()
        broker_failover()
        epilogue()
    except KeyboardInterrupt:
        print("\nInterrupted.", file=sys.stderr)
        code = 130
    except (DemoError, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as exc:
        print(f"\nDEMO FAILED: {exc}", file=sys.stderr)
        code = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip the cleanup
        banner("8. Stop everything")
        try:
            if Path(DIR, "cluster.json").exists():
                kraft("cluster", "down", "--dir", DIR, timeout=120, check=False)
        except (KeyboardInterrupt, subprocess.TimeoutExpired) as exc:
            print(
                f"cluster down did not finish ({exc!r}); run: kraft cluster down --dir {DIR}",
                file=sys.stderr,
            )
            code = code or 1
    print(f"\nDemo {'finished' if code == 0 else 'ended'} in {time.monotonic() - started:.0f}s.")
    return code


if __name__ == "__main__":
    sys.exit(main())
