"""Group coordinator operations benchmark (issue 21's open figures).

Measures (progress on stderr):
  1. ``load``: the coordinator's load path (``broker.coordinator.runtime.LogReplayer``, what a
     broker runs when it becomes leader of a ``__consumer_offsets`` partition) over a partition
     of N offset-commit records, one record per batch as sequential commits write them, in
     100 MiB segments (``offsets.topic.segment.bytes``); every record replayed (the loader before
     this change) and latest-per-key; then the log cleaner's pass and the load again. In process.
  2. ``failover``: a 3+3 cluster; a group commits, its coordinator broker is killed with -9; from
     the kill and from the moment Metadata names the new partition leader (the broker's session
     expired and the controller moved the leadership) to the first successful OffsetCommit.
  3. ``rebalance``: 10 raw-protocol members (JoinGroup v7 / SyncGroup v5 / Heartbeat v4, one
     thread and one connection each, heartbeating every 50 ms) join an empty group (initial
     delay 0: ``kraft cluster up``); from the last member's first JoinGroup to the last SyncGroup
     response of the generation holding all 10; then an 11th joins (same measurement).

Every row carries the 1-minute load average when it was measured. ``main()`` prints a markdown
table and, as the last stdout line, a JSON document of the rows and targets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import kraft, logger  # noqa: E402  (after the path set-up, run as a script)

log = logger()
LOAD_TARGET_S = 5.0
FAILOVER_TARGET_S = 3.0
REBALANCE_TARGET_S = 1.0


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)


# ---- 1. load time -----------------------------------------------------------------------------


def build_log(directory: Path, records: int, groups: int, partitions: int) -> Any:
    """A ``__consumer_offsets`` partition of ``records`` single-record offset commits cycling
    over ``groups`` x ``partitions`` keys."""
    from broker.coordinator.group.records import OffsetKey, OffsetValue, encode_key, encode_value
    from broker.coordinator.record_batch import encode_batch
    from broker.replica.partition_log import PartitionLog

    plog = PartitionLog.open(directory, segment_bytes=100 << 20)
    keys = [
        encode_key(OffsetKey(f"group-{g}", "orders", p))
        for p in range(partitions)
        for g in range(groups)
    ]
    ts = int(time.time() * 1000)
    chunk = bytearray()
    for i in range(records):
        b = bytearray(
            encode_batch([(keys[i % len(keys)], encode_value(OffsetValue(i, 0, "", ts)))], ts)
        )
        struct.pack_into(">q", b, 0, i)
        chunk += b
        if len(chunk) >= 1 << 20:
            plog.append_as_follower(bytes(chunk))
            chunk.clear()
    if chunk:
        plog.append_as_follower(bytes(chunk))
    plog.set_high_watermark(plog.log_end_offset)
    return plog


def load_once(plog: Any) -> tuple[float, int, int, int, float]:
    """(seconds, records read, records replayed, offsets in the state, CPU seconds) of one
    load."""
    from broker.coordinator.group.records import decode_record
    from broker.coordinator.group.state_machine import GroupShard
    from broker.coordinator.runtime import LogReplayer

    shard = GroupShard()
    t0, c0 = time.perf_counter(), time.process_time()
    r = LogReplayer(shard, decode_record, "bench")
    for _ in r.chunks(plog, plog.log_end_offset):
        pass
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    offsets = sum(len(g.offsets) for g in shard.groups.values())
    return seconds, r.records, r.replayed, offsets, cpu


def load_every_record(plog: Any) -> tuple[float, int]:
    """The loader before this change: every record decoded and replayed in order."""
    from broker.coordinator.group.records import decode_record
    from broker.coordinator.group.state_machine import GroupShard
    from broker.coordinator.record_batch import read_entries
    from broker.replica.partition_log import parse_batches

    shard = GroupShard()
    t0 = time.perf_counter()
    offset, end = plog.log_start_offset, plog.log_end_offset
    while offset < end:
        data = plog.read(offset, 1 << 20, max_offset=end)
        if not data:
            break
        for e in read_entries(data):
            if e.key is not None:
                shard.replay(decode_record(e.key, e.value))
        batches, _ = parse_batches(data, check_crc=False)
        offset = batches[-1].last_offset + 1
    return time.perf_counter() - t0, sum(len(g.offsets) for g in shard.groups.values())


def bench_load(
    records: int, groups: int, partitions: int, every_record: bool = True
) -> list[dict[str, Any]]:
    from broker.replica.cleaner import clean_segments
    from broker.replica.partition_log import PartitionLog

    workdir = Path(tempfile.mkdtemp(prefix="offsets-load-"))
    d = workdir / "__consumer_offsets-0"
    rows: list[dict[str, Any]] = []
    try:
        t0 = time.perf_counter()
        plog = build_log(d, records, groups, partitions)
        size = sum(p.stat().st_size for p in plog.segment_files())
        log(f"built {records} records, {size / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s")
        keys = groups * partitions
        la = loadavg()
        if every_record:
            every, n_every = load_every_record(plog)
            assert n_every == keys, n_every
            rows.append(
                {
                    "key": "load_every_record",
                    "metric": f"coordinator load, {records:,} offset records, every record "
                    "decoded and replayed (as the loader before this change)",
                    "seconds": round(every, 3),
                    "value": f"{every:.2f} s",
                    "detail": f"{size / 1e6:.0f} MB, {keys:,} keys; load avg {la}",
                    "load_avg": la,
                }
            )
            log(rows[-1]["metric"] + ": " + rows[-1]["value"])
        la = loadavg()
        secs, read, replayed, n, cpu = load_once(plog)
        assert n == keys, n
        rows.append(
            {
                "key": "load_uncompacted",
                "metric": f"coordinator load, {records:,} offset records, uncompacted",
                "seconds": round(secs, 3),
                "value": f"{secs:.2f} s",
                "detail": f"{read:,} read, {replayed:,} decoded+replayed (latest per key); "
                f"{cpu:.2f} s CPU; load avg {la}",
                "load_avg": la,
            }
        )
        log(rows[-1]["metric"] + ": " + rows[-1]["value"])
        la = loadavg()
        t0 = time.perf_counter()
        segs = plog.cleanable_segments()
        end = plog.segment_end(segs[-1][1])
        result = clean_segments(plog.dir, segs, end, plog.segment_bytes, int(time.time() * 1000),
                                86_400_000, {}, True)  # fmt: skip
        assert plog.swap_cleaned(result.groups, plog.layout_version, end)
        cleaned = time.perf_counter() - t0
        after = sum(p.stat().st_size for p in plog.segment_files())
        rows.append(
            {
                "key": "clean",
                "metric": "log cleaner pass over the closed segments",
                "seconds": round(cleaned, 3),
                "value": f"{cleaned:.2f} s",
                "detail": f"{result.bytes_before / 1e6:.0f} -> {result.bytes_after / 1e6:.2f} MB, "
                f"{result.records_removed:,} records removed; log {size / 1e6:.0f} -> "
                f"{after / 1e6:.0f} MB (active segment kept); load avg {la}",
                "load_avg": la,
            }
        )
        log(rows[-1]["metric"] + ": " + rows[-1]["value"] + " " + rows[-1]["detail"])
        la = loadavg()
        secs, read, replayed, n, cpu = load_once(plog)
        assert n == keys, n
        rows.append(
            {
                "key": "load_compacted",
                "metric": f"coordinator load, {records:,} offset records, after compaction",
                "seconds": round(secs, 3),
                "value": f"{secs:.2f} s",
                "detail": f"{read:,} records left to read (most in the active segment); "
                f"{cpu:.2f} s CPU; load avg {la}",
                "load_avg": la,
            }
        )
        log(rows[-1]["metric"] + ": " + rows[-1]["value"])
        plog.close()
        t0 = time.perf_counter()
        PartitionLog.open(d, segment_bytes=100 << 20).close()
        reopen = time.perf_counter() - t0
        rows.append(
            {
                "key": "open_compacted",
                "metric": "opening that partition log (recovery scan, producer state)",
                "seconds": round(reopen, 3),
                "value": f"{reopen:.2f} s",
                "detail": f"load avg {loadavg()}",
                "load_avg": loadavg(),
            }
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


# ---- shared cluster helpers -------------------------------------------------------------------


def find_coordinator(brokers: list[tuple[str, int]], group: str, deadline_s: float) -> Any:
    """The coordinator (node id, host, port) of ``group``, asking each broker in turn."""
    from tools.kafka_wire import KafkaWire

    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for b in brokers:
            try:
                with KafkaWire(*b, timeout=2) as w:
                    c = w.call(10, 4, {"key_type": 0, "coordinator_keys": [group]}).coordinators[0]
            except OSError:
                continue
            if c.error_code.value == 0:
                return c.node_id, c.host, c.port
        time.sleep(0.02)
    raise RuntimeError(f"no coordinator for {group}")


def commit(address: tuple[str, int], group: str, offset: int, timeout: float = 5) -> int:
    """One simple OffsetCommit v8; its partition error code."""
    from tools.kafka_wire import KafkaWire

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
                        "committed_offset": offset,
                        "committed_leader_epoch": -1,
                        "committed_metadata": "",
                    }
                ],
            }
        ],
    }
    with KafkaWire(*address, timeout=timeout) as w:
        return int(w.call(8, 8, body).topics[0].partitions[0].error_code.value)


def partition_leader(brokers: list[tuple[str, int]], topic: str, pid: int) -> int | None:
    from tools.kafka_wire import KafkaWire

    for b in brokers:
        try:
            with KafkaWire(*b, timeout=1) as w:
                meta = w.call(
                    3,
                    12,
                    {
                        "topics": [{"name": topic, "topic_id": None}],
                        "allow_auto_topic_creation": False,
                        "include_topic_authorized_operations": False,
                    },
                )
        except OSError:
            continue
        for p in meta.topics[0].partitions:
            if p.partition_index == pid:
                return int(p.leader_id)
    return None


# ---- 2. failover ------------------------------------------------------------------------------


def bench_failover(cluster: Path, rounds: int) -> list[dict[str, Any]]:
    from broker.coordinator.placement import partition_for

    meta = json.loads((cluster / "cluster.json").read_text())
    rows: list[dict[str, Any]] = []
    for r in range(rounds):
        brokers = {b["id"]: (b["host"], b["port"]) for b in meta["brokers"]}
        group = f"failover-{r}"
        node, host, port = find_coordinator(list(brokers.values()), group, 60)
        assert commit((host, port), group, 1) == 0
        pid = partition_for(group, 10)
        victim = next(b for b in meta["brokers"] if b["id"] == node)
        others = [a for i, a in brokers.items() if i != node]
        la = loadavg()
        killed = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        moved = None
        done = None
        attempts = 0
        while done is None and time.monotonic() - killed < 60:
            if moved is None:
                leader = partition_leader(others, "__consumer_offsets", pid)
                if leader is not None and leader not in (node, -1):
                    moved = time.monotonic()
            try:
                _, h, p = find_coordinator(others, group, 1)
                attempts += 1
                if commit((h, p), group, 2 + r, timeout=2) == 0:
                    done = time.monotonic()
            except (OSError, RuntimeError):
                pass
            if done is None:
                time.sleep(0.02)
        if done is None:
            raise RuntimeError("no commit within 60 s of the kill")
        if moved is None:
            moved = done
        rows.append(
            {
                "key": f"failover_{r}",
                "metric": f"coordinator failover round {r + 1}: kill -9 -> first commit",
                "seconds": round(done - moved, 3),
                "value": f"{done - moved:.2f} s after the leader moved",
                "detail": f"{done - killed:.2f} s after the kill (broker.session.timeout.ms "
                f"9000); {attempts} commit attempts; load avg {la}",
                "load_avg": la,
            }
        )
        log(rows[-1]["metric"] + ": " + rows[-1]["value"] + "; " + rows[-1]["detail"])
        kraft("cluster", "start", "--dir", str(cluster), "--node", str(node), timeout=120)
        meta = json.loads((cluster / "cluster.json").read_text())
        time.sleep(3)  # let the restarted broker catch up before the next round
    return rows


# ---- 3. rebalance -----------------------------------------------------------------------------


class Member(threading.Thread):
    """A raw classic-protocol member: join (with the MEMBER_ID_REQUIRED round), sync (the
    leader assigns), heartbeat every 50 ms, rejoin on REBALANCE_IN_PROGRESS."""

    def __init__(self, address: tuple[str, int], group: str, name: str) -> None:
        super().__init__(daemon=True)
        self.address, self.group, self.name = address, group, name
        self.member_id = ""
        self.first_join = 0.0
        self.synced: dict[int, float] = {}  # generation -> SyncGroup response time
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from tools.kafka_wire import KafkaWire

        try:
            with KafkaWire(*self.address, timeout=60, client_id=self.name) as w:
                while not self.stop.is_set():
                    gen = self._join_sync(w)
                    if gen is None:
                        continue
                    while not self.stop.wait(0.05):
                        hb = w.call(12, 4, {"group_id": self.group, "generation_id": gen,
                                            "member_id": self.member_id,
                                            "group_instance_id": None})  # fmt: skip
                        if hb.error_code.value != 0:
                            break
        except Exception as e:  # reported by settled()
            self.error = e

    def _join_sync(self, w: Any) -> int | None:
        join = {
            "group_id": self.group,
            "session_timeout": timedelta(seconds=30),
            "rebalance_timeout": timedelta(seconds=30),
            "member_id": self.member_id,
            "group_instance_id": None,
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": self.name.encode()}],
            "reason": None,
        }
        if not self.first_join:
            self.first_join = time.monotonic()
        r = w.call(11, 7, join)
        if r.error_code.value == 79:  # MEMBER_ID_REQUIRED
            self.member_id = r.member_id
            r = w.call(11, 7, dict(join, member_id=self.member_id))
        if r.error_code.value != 0:
            return None
        assignments = []
        if r.leader == self.member_id:
            assignments = [{"member_id": m.member_id, "assignment": m.metadata} for m in r.members]
        s = w.call(14, 5, {"group_id": self.group, "generation_id": r.generation_id,
                           "member_id": self.member_id, "group_instance_id": None,
                           "protocol_type": "consumer", "protocol_name": "range",
                           "assignments": assignments})  # fmt: skip
        if s.error_code.value != 0:
            return None
        self.synced[r.generation_id] = time.monotonic()
        return int(r.generation_id)


def settled(members: list[Member], deadline_s: float = 60) -> tuple[int, float]:
    """(generation, last SyncGroup response time) of the first generation every member synced."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for m in members:
            if m.error is not None:
                raise RuntimeError(f"{m.name}: {m.error!r}")
        common = set.intersection(*(set(m.synced) for m in members))
        if common:
            gen = max(common)
            return gen, max(m.synced[gen] for m in members)
        time.sleep(0.01)
    raise RuntimeError("the group did not settle")


def bench_rebalance(cluster: Path, members: int = 10) -> list[dict[str, Any]]:
    meta = json.loads((cluster / "cluster.json").read_text())
    brokers = [(b["host"], b["port"]) for b in meta["brokers"]]
    group = "bench-rebalance-raw"
    _, host, port = find_coordinator(brokers, group, 60)
    la = loadavg()
    crew = [Member((host, port), group, f"m{i}") for i in range(members)]
    for m in crew:
        m.start()
    rows: list[dict[str, Any]] = []
    try:
        gen, last_sync = settled(crew)
        last_join = max(m.first_join for m in crew)
        first = last_sync - last_join
        rows.append(
            {
                "key": "rebalance_10",
                "metric": f"{members} members join an empty group: last JoinGroup -> last "
                "SyncGroup response",
                "seconds": round(first, 3),
                "value": f"{first:.3f} s",
                "detail": f"generation {gen}; raw protocol, heartbeat 50 ms, initial delay 0; "
                f"load avg {la}",
                "load_avg": la,
            }
        )
        log(rows[-1]["metric"] + ": " + rows[-1]["value"])
        la = loadavg()
        extra = Member((host, port), group, f"m{members}")
        extra.start()
        crew.append(extra)
        gen2, last_sync = settled(crew)
        again = last_sync - extra.first_join
        rows.append(
            {
                "key": "rebalance_11th",
                "metric": f"member {members + 1} joins the stable group: its JoinGroup -> last "
                "SyncGroup response",
                "seconds": round(again, 3),
                "value": f"{again:.3f} s",
                "detail": f"generation {gen} -> {gen2}; members learn of it from a heartbeat "
                f"(50 ms); load avg {la}",
                "load_avg": la,
            }
        )
        log(rows[-1]["metric"] + ": " + rows[-1]["value"])
    finally:
        for m in crew:
            m.stop.set()
        for m in crew:
            m.join(5)
    return rows


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {r["key"]: r for r in rows}
    out = []

    def add(key: str, text: str, limit: float) -> None:
        if key in by:
            v = by[key]["seconds"]
            out.append({"target": text, "value": v, "limit": limit,
                        "ratio": round(v / limit, 3), "met": v <= limit})  # fmt: skip

    add("load_uncompacted", "load of 1M offset records (uncompacted) <= 5 s", LOAD_TARGET_S)
    add("load_compacted", "load of 1M offset records (after compaction) <= 5 s", LOAD_TARGET_S)
    fails = [r for k, r in by.items() if k.startswith("failover_")]
    if fails:
        worst = max(r["seconds"] for r in fails)
        out.append({"target": "failover -> first commit, after the session expires <= 3 s "
                    "(worst round)", "value": worst, "limit": FAILOVER_TARGET_S,
                    "ratio": round(worst / FAILOVER_TARGET_S, 3),
                    "met": worst <= FAILOVER_TARGET_S})  # fmt: skip
    add("rebalance_10", "10-member rebalance after the last JoinGroup <= 1 s", REBALANCE_TARGET_S)
    return out


def run(
    what: set[str],
    records: int,
    groups: int,
    partitions: int,
    rounds: int,
    every_record: bool = True,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    if "load" in what:
        rows += bench_load(records, groups, partitions, every_record)
    if what & {"failover", "rebalance"}:
        workdir = Path(tempfile.mkdtemp(prefix="offsets-bench-"))
        cluster = workdir / "c"
        try:
            log("starting 3 controllers + 3 brokers")
            kraft("cluster", "up", "--dir", str(cluster), "--controllers", "3", "--brokers", "3",
                  "--fsync", "never", "--detach", timeout=180)  # fmt: skip
            kraft("topics", "create", "bench", "--partitions", "1", "--replication-factor", "3",
                  "--cluster", str(cluster))  # fmt: skip
            if "rebalance" in what:
                rows += bench_rebalance(cluster)
            if "failover" in what:
                rows += bench_failover(cluster, rounds)
        finally:
            kraft("cluster", "down", "--dir", str(cluster), "--timeout", "20", timeout=120)
            shutil.rmtree(workdir, ignore_errors=True)
    return rows, targets(rows)


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| metric | value | detail |", "| --- | --- | --- |"]
    lines += [f"| {r['metric']} | {r['value']} | {r['detail']} |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="load,failover,rebalance", help="what to measure")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=10, help="partitions committed per group")
    ap.add_argument("--rounds", type=int, default=2, help="failover rounds")
    ap.add_argument(
        "--skip-every-record", action="store_true", help="skip the slow every-record load"
    )
    args = ap.parse_args()
    what = {w.strip() for w in args.only.split(",") if w.strip()}
    rows, goals = run(
        what, args.records, args.groups, args.partitions, args.rounds, not args.skip_every_record
    )
    print(table(rows))
    print(json.dumps({"system": "pykraft", "results": rows, "targets": goals}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
