"""Consumer groups with real clients against one real cluster (3 controllers + 3 brokers):
kafka-python and confluent-kafka consumers share a group and split partitions, rebalance when a
member joins or leaves, resume from committed offsets, keep a static member across a restart
without a rebalance, survive a kill -9 of the coordinator broker; kcat -G; raw requests get
Kafka's errors; ``kraft groups`` shows and resets offsets."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from datetime import timedelta
from typing import Any
from urllib.request import urlopen

import pytest
from kio.schema.errors import ErrorCode as E

from broker.coordinator.placement import partition_for
from broker.coordinator.record_batch import encode_batch
from tests.harness import LocalCluster, kraft, poll
from tools.cli import main as cli_main
from tools.group_admin import Brokers, describe_group
from tools.kafka_wire import KafkaWire

pytestmark = pytest.mark.integration

kafka = pytest.importorskip("kafka")
confluent = pytest.importorskip("confluent_kafka")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("groups") / "cluster")
    c.up(3, 3, "--fsync", "never", "--metrics")
    try:
        yield c
    finally:
        c.down()


def servers(cluster: LocalCluster) -> str:
    return ",".join(f"{b['host']}:{b['port']}" for b in cluster.meta["brokers"])


def broker_addr(cluster: LocalCluster, node_id: int) -> tuple[str, int]:
    b = next(b for b in cluster.meta["brokers"] if b["id"] == node_id)
    return b["host"], b["port"]


def create_topic(cluster: LocalCluster, name: str, partitions: int) -> None:
    """Create ``name`` and wait until every broker's Metadata serves it with a leader for each
    partition: a consumer subscribing earlier may read a broker that has not replayed the topic
    yet (kafka-python's leader then assigns nothing until its next metadata refresh)."""
    kraft(
        "topics", "create", name, "--partitions", str(partitions), "--replication-factor", "3",
        "--cluster", str(cluster.dir),
    )  # fmt: skip

    def served_everywhere() -> bool:
        for b in cluster.meta["brokers"]:
            with KafkaWire(b["host"], b["port"], timeout=5) as w:
                topics = w.call(
                    3,
                    12,
                    {
                        "topics": [{"topic_id": None, "name": name}],
                        "allow_auto_topic_creation": False,
                        "include_topic_authorized_operations": False,
                    },
                ).topics
            ready = [p for p in topics[0].partitions if p.error_code == E.none and p.leader_id >= 0]
            if topics[0].error_code != E.none or len(ready) != partitions:
                return False
        return True

    poll(served_everywhere, 30, what=f"every broker serving {name}")


def produce(cluster: LocalCluster, topic: str, values: list[str]) -> None:
    p = confluent.Producer({"bootstrap.servers": servers(cluster), "acks": "all"})
    for i, v in enumerate(values):
        p.produce(topic, v.encode(), key=str(i).encode())
    assert p.flush(30) == 0


def coordinator_of(cluster: LocalCluster, group: str) -> int:
    """The coordinator's node id, asked of any alive broker (FindCoordinator v4)."""

    def ask() -> int | None:
        for b in cluster.meta["brokers"]:
            try:
                with KafkaWire(b["host"], b["port"], timeout=5) as w:
                    c = w.call(10, 4, {"key_type": 0, "coordinator_keys": [group]}).coordinators[0]
            except OSError:
                continue
            if c.error_code == E.none:
                return c.node_id
        return None

    return poll(ask, 30, 0.2, what=f"a coordinator for {group}")


class ConsumerThread(threading.Thread):
    """One consumer (kafka-python or confluent-kafka) polling in its own thread; records what it
    read and its assignment. ``stop(leave=...)`` closes it."""

    def __init__(self, kind: str, cluster: LocalCluster, topic: str, group: str, **conf: Any):
        super().__init__(daemon=True)
        self.kind, self.topic, self.group, self.conf = kind, topic, group, conf
        self.bootstrap = servers(cluster)
        self.values: list[str] = []
        self.assigned: set[int] = set()
        self.assign_events = 0
        self.commit_each_poll = bool(conf.pop("commit_each_poll", False))
        self.commits = 0
        self._uncommitted = False  # read since the last successful commit: commit again
        self._halt = threading.Event()
        self._leave = True
        self.error: BaseException | None = None
        self.consumer: Any = None
        self.start()

    def _consumer(self) -> Any:
        if self.kind == "kp":
            owner = self

            class Listener(kafka.ConsumerRebalanceListener):
                def on_partitions_revoked(self, revoked):
                    pass

                def on_partitions_assigned(self, assigned):
                    owner.assign_events += 1

            c = kafka.KafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=self.group,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                session_timeout_ms=10000,
                heartbeat_interval_ms=500,
                max_poll_interval_ms=30000,
                **self.conf,
            )
            # Know the topic's partitions before joining. kafka-python 3.0.12 leading a group
            # without them assigns nothing, rejoins when its metadata arrives, and if that
            # join outlasts one poll while its assignment makes need_rejoin() false, never
            # reads the answer: stuck "rebalancing", no heartbeats, session expired. The same
            # spurious rejoin follows the metadata refresh after a coordinator's death; its
            # SyncGroup answer waits for the new leader's high watermark, so polls are long
            # (1 s: they return as soon as records arrive) to read it in the same poll.
            assert c.partitions_for_topic(self.topic), f"no metadata for {self.topic}"
            c.subscribe([self.topic], listener=Listener())
            return c
        c = confluent.Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 10000,
                "heartbeat.interval.ms": 500,
                "partition.assignment.strategy": "range",
                **self.conf,
            }
        )

        def on_assign(consumer, partitions):
            self.assign_events += 1

        c.subscribe([self.topic], on_assign=on_assign)
        return c

    def run(self) -> None:
        try:
            c = self.consumer = self._consumer()
            while not self._halt.is_set():
                got = self._poll(c)
                self._uncommitted = self._uncommitted or bool(got)
                if self._uncommitted and self.commit_each_poll:
                    try:
                        c.commit() if self.kind == "kp" else c.commit(asynchronous=False)
                        self.commits += 1
                        self._uncommitted = False
                    except Exception:  # coordinator moving: retried on the next poll
                        pass
                self.assigned = {tp.partition for tp in c.assignment()}
            if self._leave and self.kind == "kp":
                c.close()
            elif self.kind == "kp":
                c.close(autocommit=False)
            else:
                c.close()
        except BaseException as e:  # surfaced by stop()
            self.error = e

    def _poll(self, c: Any) -> int:
        if self.kind == "kp":
            batches = c.poll(timeout_ms=1000)
            values = [r.value.decode() for recs in batches.values() for r in recs]
        else:
            msgs = c.consume(100, 0.2)
            values = [m.value().decode() for m in msgs if m.error() is None]
        self.values += values
        return len(values)

    def client_view(self) -> dict[str, Any]:
        """What a kafka-python consumer believes about its group (for failure messages)."""
        coordinator = getattr(self.consumer, "_coordinator", None)
        if coordinator is None:
            return {}
        generation = getattr(coordinator, "_generation", None)
        return {
            "state": str(getattr(coordinator, "state", None)),
            "coordinator": getattr(coordinator, "coordinator_id", None),
            "generation": getattr(generation, "generation_id", None),
            "member_id": getattr(generation, "member_id", None),
        }

    def stop(self, leave: bool = True) -> None:
        self._leave = leave
        self._halt.set()
        self.join(30)
        assert not self.is_alive(), "consumer thread did not stop"
        assert self.error is None, repr(self.error)


def split(consumers: list[ConsumerThread], partitions: int) -> bool:
    """Every consumer owns partitions, none twice, all covered."""
    sets = [c.assigned for c in consumers]
    total = sum(len(s) for s in sets)
    return all(sets) and total == partitions and set().union(*sets) == set(range(partitions))


def group_log(cluster: LocalCluster, group: str, last: int = 30) -> list[str]:
    """The brokers' log lines about ``group``'s membership, oldest first (for failure messages)."""
    lines = []
    for b in cluster.meta["brokers"]:
        with open(b["log_file"], errors="replace") as f:
            lines += [f"{b['id']}: {line.rstrip()}" for line in f if f"group {group}:" in line]
    return sorted(lines, key=lambda line: line.split(": ", 1)[1])[-last:]


def describe(cluster: LocalCluster, group: str) -> dict:
    """What ``kraft groups describe --json`` prints (its function, called in-process)."""
    brokers = Brokers([(b["host"], b["port"]) for b in cluster.meta["brokers"]], 10)
    try:
        return describe_group(brokers, group)
    finally:
        brokers.close()


def cli(capsys: Any, *args: str) -> tuple[int, str, str]:
    """Run ``kraft ARGS`` in-process (the real command line, without a new interpreter)."""
    capsys.readouterr()
    rc = cli_main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


# ---- tests -------------------------------------------------------------------------------------


def test_two_clients_split_partitions_then_rebalance(cluster):
    create_topic(cluster, "split", 6)
    a = ConsumerThread("kp", cluster, "split", "mixed", client_id="kp-a")
    b = ConsumerThread("ck", cluster, "split", "mixed", **{"client.id": "ck-b"})
    c = None
    try:
        poll(lambda: split([a, b], 6), 40, what="kafka-python and confluent splitting 6")
        d = describe(cluster, "mixed")
        assert d["state"] == "Stable" and {m["client_id"] for m in d["members"]} == {"kp-a", "ck-b"}
        c = ConsumerThread("kp", cluster, "split", "mixed", client_id="kp-c")
        poll(lambda: split([a, b, c], 6), 40, what="a third member joining")
        b.stop(leave=True)
        poll(lambda: split([a, c], 6), 40, what="rebalance after a member left")
        assert {m["client_id"] for m in describe(cluster, "mixed")["members"]} == {"kp-a", "kp-c"}
    finally:
        for t in (a, b, c):
            if t is not None and t.is_alive():
                t.stop()


def test_commit_restart_resumes_from_committed_offset(cluster):
    create_topic(cluster, "resume", 3)
    first_batch = [f"r{i}" for i in range(30)]
    produce(cluster, "resume", first_batch)
    c1 = kafka.KafkaConsumer(
        "resume",
        bootstrap_servers=servers(cluster),
        group_id="resumers",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=4,
    )
    read1: list[str] = []
    deadline = time.monotonic() + 30
    while len(read1) < 12 and time.monotonic() < deadline:
        for recs in c1.poll(timeout_ms=500).values():
            read1 += [r.value.decode() for r in recs]
    assert len(read1) >= 12
    c1.commit()
    c1.close()
    produce(cluster, "resume", [f"r{i}" for i in range(30, 40)])
    c2 = ConsumerThread("ck", cluster, "resume", "resumers")
    try:
        poll(lambda: len(c2.values) >= 40 - len(read1), 40, what="the rest after restart")
    finally:
        c2.stop()
    assert not set(read1) & set(c2.values), "re-read committed messages"
    assert sorted(read1 + c2.values) == sorted(f"r{i}" for i in range(40)), "skipped messages"
    d = describe(cluster, "resumers")
    assert d["state"] == "Empty"
    assert sum(p["current_offset"] for p in d["partitions"]) == len(read1)
    assert sum(p["lag"] for p in d["partitions"]) == 40 - len(read1)


def test_static_member_restart_without_rebalance(cluster):
    create_topic(cluster, "static", 4)
    a = ConsumerThread("kp", cluster, "static", "statics", client_id="kp-dynamic")
    conf = {"group.instance.id": "ck-static-1", "session.timeout.ms": 30000}
    b = ConsumerThread("ck", cluster, "static", "statics", **conf)
    try:
        try:
            poll(lambda: split([a, b], 4), 90, what="two members splitting 4")
        except AssertionError as e:  # say what the group and the clients looked like
            state = (
                describe(cluster, "statics"),
                a.assigned,
                b.assigned,
                a.error,
                b.error,
                a.client_view(),
                group_log(cluster, "statics"),
            )
            raise AssertionError(f"{e}; group, assignments, errors: {state!r}") from None
        before = describe(cluster, "statics")
        owned, a_events = set(b.assigned), a.assign_events
        b.stop(leave=False)  # a static member sends no LeaveGroup
        b = ConsumerThread("ck", cluster, "static", "statics", **conf)
        poll(lambda: b.assigned == owned, 30, what="the static member's old assignment back")
        after = describe(cluster, "statics")
        assert after["state"] == "Stable" and a.assign_events == a_events  # no rebalance
        ids = {m["group_instance_id"]: m["member_id"] for m in after["members"]}
        old = {m["group_instance_id"]: m["member_id"] for m in before["members"]}
        assert ids["ck-static-1"] != old["ck-static-1"] and len(ids) == 2
    finally:
        a.stop()
        b.stop()


def test_bad_input_gets_kafka_errors(cluster):
    create_topic(cluster, "raw", 1)
    group = "raw-group"
    home = partition_for(group, 10)  # kraft cluster up: offsets.topic.num.partitions=10
    node = coordinator_of(cluster, group)
    other = next(b["id"] for b in cluster.meta["brokers"] if b["id"] != node)
    join = {
        "group_id": group,
        "session_timeout": timedelta(seconds=10),
        "rebalance_timeout": timedelta(seconds=10),
        "member_id": "",
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b""}],
        "reason": None,
    }
    with KafkaWire(*broker_addr(cluster, node)) as w:
        hb = {
            "group_id": group,
            "generation_id": 1,
            "member_id": "nobody",
            "group_instance_id": None,
        }
        assert w.call(12, 4, hb).error_code == E.unknown_member_id
        first = w.call(11, 7, join)
        assert first.error_code == E.member_id_required and first.member_id
        joined = w.call(11, 7, dict(join, member_id=first.member_id))
        assert joined.error_code == E.none and joined.leader == first.member_id
        gen, me = joined.generation_id, first.member_id
        sync = {
            "group_id": group,
            "generation_id": gen,
            "member_id": me,
            "group_instance_id": None,
            "protocol_type": "consumer",
            "protocol_name": "range",
            "assignments": [{"member_id": me, "assignment": b""}],
        }
        assert w.call(14, 5, dict(sync, generation_id=gen + 5)).error_code == E.illegal_generation
        assert w.call(14, 5, sync).error_code == E.none
        assert w.call(12, 4, dict(hb, member_id=me, generation_id=gen - 1)).error_code == (
            E.illegal_generation
        )
        assert w.call(12, 4, dict(hb, member_id=me, generation_id=gen)).error_code == E.none

        def commit(topic: str, generation: int) -> Any:
            return (
                w.call(
                    8,
                    8,
                    {
                        "group_id": group,
                        "generation_id_or_member_epoch": generation,
                        "member_id": me,
                        "group_instance_id": None,
                        "topics": [
                            {
                                "name": topic,
                                "partitions": [
                                    {
                                        "partition_index": 0,
                                        "committed_offset": 1,
                                        "committed_leader_epoch": -1,
                                        "committed_metadata": None,
                                    }
                                ],
                            }
                        ],
                    },
                )
                .topics[0]
                .partitions[0]
                .error_code
            )

        assert commit("no-such-topic", gen) == E.unknown_topic_or_partition
        assert commit("raw", gen + 1) == E.illegal_generation
        assert commit("raw", gen) == E.none
        short = dict(join, session_timeout=timedelta(seconds=1))
        assert w.call(11, 7, short).error_code == E.invalid_session_timeout
        produced = w.call(
            0,
            8,
            {
                "transactional_id": None,
                "acks": -1,
                "timeout": timedelta(seconds=5),
                "topic_data": [
                    {
                        "name": "__consumer_offsets",
                        "partition_data": [
                            {"index": 0, "records": encode_batch([(b"k", b"v")], 0)}
                        ],
                    }
                ],
            },
        )
        assert produced.responses[0].partition_responses[0].error_code == E.invalid_topic_exception
        # a group never seen, on the same coordinator partition (a v8 request names groups of
        # one coordinator)
        unseen = next(
            f"unseen-{i}" for i in range(1000) if partition_for(f"unseen-{i}", 10) == home
        )
        fetched = w.call(
            9,
            8,
            {
                "groups": [
                    {"group_id": g, "topics": [{"name": "raw", "partition_indexes": [0]}]}
                    for g in (group, unseen)
                ],
                "require_stable": False,
            },
        )
        assert [
            (g.group_id, g.topics[0].partitions[0].committed_offset) for g in fetched.groups
        ] == [(group, 1), (unseen, -1)]
        leave = {"group_id": group, "members": [{"member_id": me, "group_instance_id": None}]}
        assert w.call(13, 4, leave).members[0].error_code == E.none
    with KafkaWire(*broker_addr(cluster, other)) as w:
        assert w.call(12, 4, dict(hb, member_id=me)).error_code == E.not_coordinator
        meta = w.call(
            3,
            12,
            {
                "topics": [{"name": "__consumer_offsets", "topic_id": None}],
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False,
            },
        )
    offsets_topic = meta.topics[0]
    assert offsets_topic.is_internal and len(offsets_topic.partitions) == 10
    assert all(len(p.replica_nodes) == 3 for p in offsets_topic.partitions)
    d = describe(cluster, group)
    assert d["state"] == "Empty" and d["partitions"][0]["current_offset"] == 1
    metrics_port = next(b for b in cluster.meta["brokers"] if b["id"] == node)["metrics_port"]
    with urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    empty = 'kafka_server_group_coordinator_metrics_classic_group_count{state="Empty"} '
    assert float(next(ln for ln in text.splitlines() if ln.startswith(empty)).split()[-1]) >= 1
    assert 'kafka_server_group_coordinator_metrics_num_partitions{state="active"}' in text
    count = "kafka_server_group_coordinator_metrics_offset_commit_count "
    assert float(next(ln for ln in text.splitlines() if ln.startswith(count)).split()[-1]) >= 1
    assert "kafka_server_group_coordinator_metrics_offset_commit_rate " in text
    assert "kafka_server_group_coordinator_metrics_partition_load_time_max " in text
    assert "kafka_log_logcleaner_passes " in text


def test_cli_reset_offsets_and_delete(cluster, capsys):
    create_topic(cluster, "reset", 2)
    produce(cluster, "reset", [f"x{i}" for i in range(10)])
    where = ("--cluster", str(cluster.dir))
    reset = ("groups", "reset-offsets", "resetters", "--topic", "reset")
    c = ConsumerThread("kp", cluster, "reset", "resetters", commit_each_poll=True)
    try:
        poll(lambda: len(c.values) >= 10 and c.commits, 40, what="consuming and committing")
        rc, _, err = cli(capsys, *reset, "--to-earliest", *where)
        assert rc == 1 and "NON_EMPTY_GROUP" in err  # members are active
    finally:
        c.stop()
    poll(lambda: sum(p["lag"] for p in describe(cluster, "resetters")["partitions"]) == 0, 20)
    rc, out, _ = cli(capsys, *reset, "--to-earliest", *where, "--json")
    dry = json.loads(out)
    assert rc == 0 and not dry["executed"] and {o["new_offset"] for o in dry["offsets"]} == {0}
    assert sum(p["lag"] for p in describe(cluster, "resetters")["partitions"]) == 0
    assert cli(capsys, *reset, "--to-offset", "2", "--execute", *where)[0] == 0
    rc, out, _ = cli(capsys, "groups", "describe", "resetters", *where)
    assert rc == 0 and "LOG-END-OFFSET" in out and "Empty" in out
    assert {p["current_offset"] for p in describe(cluster, "resetters")["partitions"]} == {2}
    rc, out, _ = cli(capsys, "groups", "list", *where, "--json")
    assert "resetters" in {g["group"] for g in json.loads(out)}
    assert cli(capsys, "groups", "delete", "resetters", *where)[0] == 0
    rc, _, err = cli(capsys, "groups", "describe", "resetters", *where)
    assert rc == 1 and "GROUP_ID_NOT_FOUND" in err


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_balanced_consumer(cluster):
    create_topic(cluster, "kc", 2)
    produce(cluster, "kc", [f"k{i}" for i in range(10)])
    out = subprocess.run(
        ["kcat", "-b", servers(cluster), "-G", "kcat-group", "-o", "beginning", "-e", "-q", "kc"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sorted(out.stdout.split()) == sorted(f"k{i}" for i in range(10)), out.stderr

    def committed() -> int:
        return sum(p["current_offset"] for p in describe(cluster, "kcat-group")["partitions"])

    poll(lambda: committed() == 10, 20, what="kcat's committed offsets")


class Kip848Consumer(ConsumerThread):
    """A confluent-kafka consumer with ``group.protocol=consumer`` (KIP-848): no session,
    heartbeat or assignor settings on the client; the coordinator's uniform assignor splits."""

    def _consumer(self) -> Any:
        c = confluent.Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "group.protocol": "consumer",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                **self.conf,
            }
        )
        c.subscribe([self.topic])
        return c


def test_kip848_consumer_protocol_split_rebalance_commit_resume(cluster, capsys):
    """librdkafka's group.protocol=consumer: two members split 6 partitions, a third joins, one
    leaves (incremental reassignment), every record is read, commits resume a new member."""
    create_topic(cluster, "kip848", 6)
    values = [f"k{i}" for i in range(60)]
    produce(cluster, "kip848", values)
    conf = {"commit_each_poll": True}
    a = Kip848Consumer("ck", cluster, "kip848", "g848", **conf, **{"client.id": "k-a"})
    b = Kip848Consumer("ck", cluster, "kip848", "g848", **conf, **{"client.id": "k-b"})
    c = d = None
    try:
        poll(lambda: split([a, b], 6), 40, what="two consumer-protocol members splitting 6")
        info = describe(cluster, "g848")
        assert info["type"] == "consumer" and info["assignor"] == "uniform"
        assert {m["client_id"] for m in info["members"]} == {"k-a", "k-b"}
        c = Kip848Consumer("ck", cluster, "kip848", "g848", **conf, **{"client.id": "k-c"})
        poll(lambda: split([a, b, c], 6), 40, what="a third member joining")
        assert sorted(len(t.assigned) for t in (a, b, c)) == [2, 2, 2]
        a.stop(leave=True)
        more = [f"k{i}" for i in range(60, 90)]
        produce(cluster, "kip848", more)
        poll(lambda: split([b, c], 6), 40, what="rebalance after a member left")
        poll(
            lambda: set(values + more) <= set(a.values + b.values + c.values),
            30,
            what="every record read",
        )

        def all_committed() -> bool:
            parts = describe(cluster, "g848")["partitions"]
            return len(parts) == 6 and all(p["lag"] == 0 for p in parts)

        poll(all_committed, 30, what="commits covering every record")
        # raw requests (the project's kio codec) get Kafka's errors from the coordinator
        member = next(m for m in describe(cluster, "g848")["members"] if m["client_id"] == "k-b")
        heartbeat = {"group_id": "g848", "member_id": member["member_id"], "member_epoch": 999,
                     "rebalance_timeout": timedelta(milliseconds=-1), "subscribed_topic_names":
                     None, "server_assignor": None, "topic_partitions": None}  # fmt: skip
        with KafkaWire(*broker_addr(cluster, coordinator_of(cluster, "g848"))) as w:
            assert w.call(68, 1, heartbeat).error_code == E.fenced_member_epoch
            assert w.call(68, 1, dict(heartbeat, member_id="nobody")).error_code == (
                E.unknown_member_id
            )
            joining = dict(heartbeat, member_id="x", member_epoch=0, server_assignor="sticky",
                           rebalance_timeout=timedelta(seconds=30), topic_partitions=[],
                           subscribed_topic_names=["kip848"])  # fmt: skip
            assert w.call(68, 1, joining).error_code == E.unsupported_assignor
            classic_join = {
                "group_id": "g848", "session_timeout": timedelta(seconds=10),
                "rebalance_timeout": timedelta(seconds=10), "member_id": "",
                "group_instance_id": None, "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b""}], "reason": None,
            }  # fmt: skip
            assert w.call(11, 7, classic_join).error_code == E.inconsistent_group_protocol
            commit = {"group_id": "g848", "generation_id_or_member_epoch": 1,
                      "member_id": member["member_id"], "group_instance_id": None, "topics": [
                          {"name": "kip848", "partitions": [{"partition_index": 0,
                           "committed_offset": 0, "committed_leader_epoch": -1,
                           "committed_metadata": ""}]}]}  # fmt: skip
            stale = w.call(
                8, 9, dict(commit, generation_id_or_member_epoch=member["member_epoch"] - 1)
            )
            assert stale.topics[0].partitions[0].error_code == E.stale_member_epoch
            unknown = w.call(8, 9, dict(commit, member_id="nobody"))
            assert unknown.topics[0].partitions[0].error_code == E.unknown_member_id
        # confluent's AdminClient: ConsumerGroupDescribe here, DescribeGroups for a classic group
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": servers(cluster)})
        with KafkaWire(*broker_addr(cluster, coordinator_of(cluster, "classic848"))) as w:
            w.call(8, 8, {"group_id": "classic848", "generation_id_or_member_epoch": -1,
                          "member_id": "", "group_instance_id": None, "topics": [
                              {"name": "kip848", "partitions": [{"partition_index": 0,
                               "committed_offset": 1, "committed_leader_epoch": -1,
                               "committed_metadata": ""}]}]})  # fmt: skip
        found = admin.describe_consumer_groups(["g848", "classic848"])
        new_type, classic_type = found["g848"].result(20), found["classic848"].result(20)
        assert new_type.type == confluent.ConsumerGroupType.CONSUMER
        assert {m.client_id for m in new_type.members} == {"k-b", "k-c"}
        assert classic_type.type == confluent.ConsumerGroupType.CLASSIC
        listing = {g.group_id: g.type for g in admin.list_consumer_groups().result(20).valid}
        assert listing["g848"] == confluent.ConsumerGroupType.CONSUMER
        rc, out, _ = cli(capsys, "groups", "list", "--json", "--cluster", str(cluster.dir))
        listed = json.loads(out)
        assert {"group": "g848", "state": "Stable", "protocol_type": "consumer",
                "type": "consumer"} in listed  # fmt: skip
        for t in (b, c):
            t.stop(leave=True)
        poll(lambda: describe(cluster, "g848")["state"] == "Empty", 20, what="an empty group")
        last = [f"k{i}" for i in range(90, 100)]
        produce(cluster, "kip848", last)
        d = Kip848Consumer("ck", cluster, "kip848", "g848", **{"client.id": "k-d"})
        poll(lambda: set(last) <= set(d.values), 40, what="the resumed member reading on")
        assert sorted(d.values) == sorted(last)  # from the committed offsets: nothing re-read
    finally:
        for t in (a, b, c, d):
            if t is not None and t.is_alive():
                t.stop()


def replica_state(cluster: LocalCluster, node_id: int, topic: str, pid: int) -> dict[str, Any]:
    from broker.state import describe as broker_state

    b = next(b for b in cluster.meta["brokers"] if b["id"] == node_id)
    parts = broker_state(b["host"], b["admin_port"])["partitions"]
    return next(p for p in parts if p["topic"] == topic and p["partition"] == pid)


def test_compaction_latest_values_and_offsets_survive_a_reload(cluster):
    """Before the kill test (it restarts a broker). The log cleaner compacts a topic with small
    segments on every replica: kafka-python reads the latest value of every key from it. Then
    __consumer_offsets gets small segments; after its cleaner ran on every replica, the group's
    coordinator is stopped and the new one, loading the compacted log, has the same offsets."""
    kraft(
        "topics", "create", "compacted", "--partitions", "1", "--replication-factor", "3",
        "--config", "cleanup.policy=compact", "--config", "segment.bytes=1024",
        "--config", "min.cleanable.dirty.ratio=0.01", "--cluster", str(cluster.dir),
    )  # fmt: skip
    p = confluent.Producer({"bootstrap.servers": servers(cluster), "acks": "all"})
    nodes = [b["id"] for b in cluster.meta["brokers"]]
    rounds = []

    def produce_round() -> bool:
        rounds.append(len(rounds))
        for k in range(10):
            p.produce("compacted", f"r{rounds[-1]}".encode(), key=f"k{k}".encode())
        assert p.flush(30) == 0
        return all(replica_state(cluster, n, "compacted", 0)["cleaner_checkpoint"] > 0
                   for n in nodes)  # fmt: skip

    poll(produce_round, 60, 0.3, what="every replica of 'compacted' cleaned")
    p.produce("compacted", None, key=b"k0")  # a tombstone: kept (delete.retention.ms 1 day)
    assert p.flush(30) == 0
    total = 10 * len(rounds) + 1
    c = kafka.KafkaConsumer(
        bootstrap_servers=servers(cluster), auto_offset_reset="earliest",
        consumer_timeout_ms=3000, enable_auto_commit=False,
    )  # fmt: skip
    tp = kafka.TopicPartition("compacted", 0)
    c.assign([tp])
    seen = [(m.offset, m.key, m.value) for m in c]
    c.close()
    latest = {k: v for _, k, v in seen}
    last = f"r{rounds[-1]}".encode()
    assert latest == {b"k0": None, **{f"k{k}".encode(): last for k in range(1, 10)}}
    assert len(seen) < total and seen[-1][0] == total - 1  # compacted, offsets kept

    group = "compacted-offsets"
    pid = partition_for(group, 10)
    node = coordinator_of(cluster, group)  # creates __consumer_offsets if need be
    kraft(
        "configs", "alter", "--topic", "__consumer_offsets", "--set", "segment.bytes=2048",
        "--set", "min.cleanable.dirty.ratio=0.01", "--cluster", str(cluster.dir),
    )  # fmt: skip

    def commit_all(w: KafkaWire, round_: int) -> None:
        body = {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                "group_instance_id": None, "topics": [{"name": "compacted", "partitions": [
                    {"partition_index": 0, "committed_offset": round_,
                     "committed_leader_epoch": -1, "committed_metadata": f"m{round_}"}]}]}  # fmt: skip
        assert w.call(8, 8, body).topics[0].partitions[0].error_code == E.none

    committed: list[int] = []

    def commit_rounds() -> bool:
        with KafkaWire(*broker_addr(cluster, node)) as w:
            for _ in range(20):
                committed.append(len(committed))
                commit_all(w, committed[-1])
        return all(
            replica_state(cluster, n, "__consumer_offsets", pid)["cleaner_checkpoint"] > 0
            for n in nodes
        )

    poll(commit_rounds, 60, 0.3, what="every replica of the group's partition cleaned")
    try:
        cluster.kill(node, "TERM")
        moved = poll(lambda: (nid := coordinator_of(cluster, group)) != node and nid, 60,
                     what="a new coordinator")  # fmt: skip
        fetch = {"groups": [{"group_id": group, "topics": None}], "require_stable": False}

        def fetched() -> Any:
            with KafkaWire(*broker_addr(cluster, moved)) as w:
                g = w.call(9, 8, fetch).groups[0]
            return g if g.error_code == E.none else None

        g = poll(fetched, 30, 0.2, what="OffsetFetch from the new coordinator")
        parts = [(t.name, p.partition_index, p.committed_offset, p.metadata)
                 for t in g.topics for p in t.partitions]  # fmt: skip
        n = committed[-1]
        assert parts == [("compacted", 0, n, f"m{n}")]
    finally:
        kraft(
            "configs", "alter", "--topic", "__consumer_offsets", "--delete", "segment.bytes",
            "--delete", "min.cleanable.dirty.ratio", "--cluster", str(cluster.dir),
        )  # fmt: skip
        cluster.start(node)

        def back_in_isr() -> bool:
            for n in nodes:
                state = replica_state(cluster, n, "__consumer_offsets", pid)
                if state["role"] == "leader":
                    return node in state["isr"]
            return False

        poll(back_in_isr, 60, what="the stopped broker back in the ISR")


def test_kill_coordinator_moves_group_with_offsets(cluster):
    """Last: leaves a broker dead. kill -9 the coordinator mid-consumption; the group moves to
    the new leader of its partition with its committed offsets; every message is read, and
    the offsets of what was produced after the kill are committed to the new coordinator.
    (confluent-kafka: kafka-python 3.0.12 can stop reading its own SyncGroup answer when the
    coordinator moves, a client bug the README describes.)"""
    create_topic(cluster, "failover", 3)
    values = [f"f{i}" for i in range(60)]
    produce(cluster, "failover", values)
    c = ConsumerThread("ck", cluster, "failover", "movers", commit_each_poll=True)
    try:
        poll(lambda: len(c.values) >= 10 and c.commits, 40, what="consuming and committing")
        node = coordinator_of(cluster, "movers")
        committed_before = {  # partitions with a committed offset (None: none committed yet)
            p["partition"]: p["current_offset"]
            for p in describe(cluster, "movers")["partitions"]
            if p["current_offset"] is not None
        }
        cluster.kill(node)
        more = [f"f{i}" for i in range(60, 90)]
        produce(cluster, "failover", more)

        def all_read() -> bool:
            missing = set(values + more) - set(c.values)
            if missing:  # reported if it never happens: what the client believes
                raise AssertionError(f"{len(missing)} unread; client {c.client_view()}")
            return True

        poll(all_read, 60, what="every message read")
        moved = coordinator_of(cluster, "movers")
        assert moved != node

        def all_committed() -> dict[int, int]:
            parts = describe(cluster, "movers")["partitions"]
            done = {p["partition"]: p["current_offset"] for p in parts}
            assert sum(p["log_end_offset"] or 0 for p in parts) == 90, parts
            if len(done) != 3 or any(p["current_offset"] != p["log_end_offset"] for p in parts):
                raise AssertionError(f"not all committed yet: {parts}")
            return done

        after = poll(all_committed, 60, what="every offset committed to the new coordinator")
        assert all(after[p] >= off for p, off in committed_before.items())
    finally:
        c.stop()
