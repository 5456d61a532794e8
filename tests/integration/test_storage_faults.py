"""Disk faults on real controller processes: a full disk, a damaged journal, wiped directories.

What pykraft promises (docs/design.md, "Failure model"): a controller that cannot persist stops
(exit 3) and the others go on with every acknowledged write; a damaged journal refuses to start
naming file, byte and entry, and ``kraft storage recover --from-peers`` rebuilds it; a wiped
directory never starts unformatted, and blank controllers never form a cluster of their own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from kraft.quorum import journal_file as jf
from kraft.rpc.client import call_sync
from kraft.storage import meta_properties as mp
from tests.harness import ENV, REPO, LocalCluster, kraft, poll


@pytest.fixture()
def cluster(tmp_path: Path):
    c = LocalCluster(tmp_path / "c")
    try:
        # the faults here are about disks, not access: the helpers below call the RPC
        # anonymously, so this cluster runs without controller RPC authentication
        yield c.up(3, 1, "--no-auth")
    finally:
        c.down()


def describe(cluster: LocalCluster, node_id: int) -> dict[str, Any]:
    c = cluster.controller(node_id)
    return call_sync([(c["host"], c["rpc_port"])], "DescribeNode", {"checksum": True}, 5.0)


def create_topic(cluster: LocalCluster, name: str, partitions: int = 1) -> bool:
    """True when the cluster acknowledged the topic."""
    proc = kraft(
        "topics", "create", "--cluster", str(cluster.dir), name,
        "--partitions", str(partitions), check=False, timeout=60,
    )  # fmt: skip
    return proc.returncode == 0


def topic_names(cluster: LocalCluster) -> set[str]:
    out = kraft("topics", "list", "--cluster", str(cluster.dir), "--json").stdout
    data = json.loads(out)
    items = data["topics"] if isinstance(data, dict) else data
    return {t["name"] if isinstance(t, dict) else t for t in items}


def run_controller(cluster: LocalCluster, node_id: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.cli", "controller", "--config", config_of(cluster, node_id)],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )


def config_of(cluster: LocalCluster, node_id: int) -> str:
    return cluster.controller(node_id)["config"]


def meta_dir(cluster: LocalCluster, node_id: int) -> Path:
    return Path(cluster.controller(node_id)["metadata_dir"])


def converged(cluster: LocalCluster, nodes: list[int]) -> bool:
    """Every node applied the same offset with the same image checksum, none still joining."""
    states = [describe(cluster, n) for n in nodes]
    return (
        not any(s.get("joining") for s in states)
        and len({(s["applied_offset"], s["image_checksum"]) for s in states}) == 1
    )


# ---- a full disk ---------------------------------------------------------------------------


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return proc.returncode == 0


def _fill(directory: Path) -> None:
    """Write until the file system refuses: the disk is full."""
    chunk = bytes(1 << 16)
    with open(directory / "filler", "wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError:
                break
    for size in (4096, 512, 1):  # the last partial blocks too
        with open(directory / "filler", "ab", buffering=0) as f:
            try:
                while True:
                    f.write(bytes(size))
            except OSError:
                pass


def test_a_controller_whose_disk_fills_exits_and_the_others_keep_every_acknowledged_write(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    meta = meta_dir(cluster, 3)
    cluster.kill(3, "TERM")
    saved = tmp_path / "saved-meta"
    shutil.copytree(meta, saved)
    shutil.rmtree(meta)
    if not _mount_tmpfs(meta, "48m"):
        pytest.skip("mounting a tmpfs needs root (the full disk is a real ENOSPC)")
    proc = None
    try:
        shutil.copytree(saved, meta, dirs_exist_ok=True)
        stderr = tmp_path / "controller-3.err"
        with open(stderr, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tools.cli", "controller", "--config",
                 config_of(cluster, 3)],
                cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
        acked = {name for name in (f"before-{i}" for i in range(2)) if create_topic(cluster, name)}
        assert len(acked) == 2
        poll(lambda: converged(cluster, [1, 2, 3]), 60, what="controller 3 caught up")
        _fill(meta)
        deadline = time.monotonic() + 120
        i = 0
        while proc.poll() is None and time.monotonic() < deadline:
            name = f"full-{i}"
            if create_topic(cluster, name, partitions=50):  # >4 KiB of records: new pages
                acked.add(name)
            i += 1
        assert proc.poll() == 3, "controller 3 kept running on a full disk"
        text = stderr.read_text()
        assert "fatal storage error" in text and "No space left on device" in text, text
        assert "kraft storage recover" in text
        for name in ("after-0", "after-1"):  # the other two still serve writes
            assert poll(lambda name=name: create_topic(cluster, name), 60, what=name)
            acked.add(name)
        assert acked <= topic_names(cluster)
        poll(lambda: converged(cluster, [1, 2]), 30, what="controllers 1 and 2 agree")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        subprocess.run(["umount", "-l", str(meta)], capture_output=True, timeout=30)


# ---- a damaged journal, and recovery from the peers ---------------------------------------


def test_a_flipped_journal_byte_refuses_start_and_recover_rebuilds_from_peers(
    cluster: LocalCluster,
) -> None:
    for i in range(4):
        assert create_topic(cluster, f"t{i}")
    poll(lambda: converged(cluster, [1, 2, 3]), 60, what="all three agree")
    cluster.kill(3, "TERM")
    journal = meta_dir(cluster, 3) / "raft" / "journal.bin"
    entries, offsets, _ = jf.read_entries(str(journal), journal.read_bytes())
    k = len(entries) // 2
    data = bytearray(journal.read_bytes())
    data[offsets[k] + 8 + 16] ^= 0x40  # the first byte of entry k's command
    journal.write_bytes(bytes(data))

    refused = run_controller(cluster, 3)
    assert refused.returncode == 1, refused.stderr
    assert f"corrupt raft journal {journal} at byte {offsets[k]} (entry #{k})" in refused.stderr
    assert "checksum mismatch" in refused.stderr
    assert "kraft storage recover --config" in refused.stderr and "Traceback" not in refused.stderr

    out = kraft("storage", "recover", "--config", config_of(cluster, 3), "--from-peers").stdout
    assert "formatted to join the running quorum" in out
    moved = list(meta_dir(cluster, 3).parent.glob("metadata.damaged-*"))
    assert len(moved) == 1 and (moved[0] / "raft" / "journal.bin").exists()  # kept, not deleted
    assert mp.joining(meta_dir(cluster, 3))

    cluster.start(3)
    poll(lambda: converged(cluster, [1, 2, 3]), 90, what="controller 3 rebuilt from its peers")
    assert not mp.joining(meta_dir(cluster, 3))
    assert create_topic(cluster, "after-recovery")
    poll(lambda: converged(cluster, [1, 2, 3]), 60, what="controller 3 follows new writes")
    assert {f"t{i}" for i in range(4)} | {"after-recovery"} <= topic_names(cluster)


# ---- a torn last journal entry ---------------------------------------------------------------


def test_a_torn_last_journal_entry_is_truncated_on_start_and_the_controller_rejoins(
    cluster: LocalCluster,
) -> None:
    """A crash in the middle of an append: the header's end offset reached the disk, the
    entry behind it only in part. The controller drops that entry with a warning, starts, and
    the leader sends it again."""
    for i in range(3):
        assert create_topic(cluster, f"t{i}")
    poll(lambda: converged(cluster, [1, 2, 3]), 60, what="all three agree")
    cluster.kill(3, "KILL")
    journal = meta_dir(cluster, 3) / "raft" / "journal.bin"
    entries, offsets, end = jf.read_entries(str(journal), journal.read_bytes())
    last = offsets[-1]
    data = bytearray(journal.read_bytes())
    data[last + 8 + 16 : end] = bytes(end - last - 24)  # the last entry's command never written
    journal.write_bytes(bytes(data))

    cluster.start(3)
    log = Path(cluster.controller(3)["log_file"])
    poll(
        lambda: f"last entry (#{len(entries) - 1} at byte {last}) is torn" in log.read_text(),
        30,
        what="the torn entry reported",
    )
    poll(lambda: converged(cluster, [1, 2, 3]), 90, what="controller 3 caught up")
    assert create_topic(cluster, "after-torn")
    poll(lambda: converged(cluster, [1, 2, 3]), 60, what="controller 3 follows new writes")
    assert {"t0", "t1", "t2", "after-torn"} <= topic_names(cluster)
    rebuilt, _, _ = jf.read_entries(str(journal), journal.read_bytes())
    assert rebuilt[len(entries) - 1][1] == entries[-1][1]  # the dropped index came back
    assert "Traceback" not in log.read_text()


# ---- wiped directories -----------------------------------------------------------------------


def test_two_wiped_controllers_started_first_never_form_a_new_cluster(
    cluster: LocalCluster,
) -> None:
    assert create_topic(cluster, "history")
    poll(lambda: converged(cluster, [1, 2, 3]), 60, what="all three agree")
    for node in (1, 2, 3):
        cluster.kill(node, "TERM")
    for node in (1, 2):
        shutil.rmtree(meta_dir(cluster, node))
        meta_dir(cluster, node).mkdir()

    refused = run_controller(cluster, 1)  # wiped: refuses, names the recovery
    assert refused.returncode == 1
    assert "has no meta.properties: its data was wiped" in refused.stderr
    assert f"kraft storage recover --config {config_of(cluster, 1)} --from-peers" in refused.stderr
    assert not mp.holds_data(meta_dir(cluster, 1))  # and wrote nothing

    no_quorum = kraft("storage", "recover", "--config", config_of(cluster, 1), "--from-peers",
                      check=False)  # fmt: skip
    assert no_quorum.returncode == 1 and "cannot reach the other controllers" in no_quorum.stderr

    for node in (1, 2):  # the operator formats them to join (not as a new quorum)
        kraft("storage", "format", "--config", config_of(cluster, node), "--no-initial-controllers")
        cluster.start(node)
    poll(lambda: describe(cluster, 1) and describe(cluster, 2), 30, what="1 and 2 answer")
    quiet_until = time.monotonic() + 5 * 1.0  # five election timeouts
    while time.monotonic() < quiet_until:
        for node in (1, 2):
            raft = describe(cluster, node)["raft"]
            assert raft["state"] != "leader" and raft["leader_id"] is None, (node, raft)
        time.sleep(0.2)

    cluster.start(3)  # the one with history leads; the blank ones copy it
    poll(lambda: converged(cluster, [1, 2, 3]), 90, what="1 and 2 caught up from 3")
    assert describe(cluster, 3)["raft"]["leader_id"] == 3
    assert "history" in topic_names(cluster)
    assert create_topic(cluster, "new")
    poll(lambda: converged(cluster, [1, 2, 3]), 60, what="one history")


def test_a_directory_from_before_meta_properties_is_refused_then_adopted(
    cluster: LocalCluster,
) -> None:
    """v1 clusters (no meta.properties) get a clear error naming --ignore-formatted."""
    assert create_topic(cluster, "kept")
    cluster.kill(2, "TERM")
    (meta_dir(cluster, 2) / mp.META_PROPERTIES).unlink()
    refused = run_controller(cluster, 2)
    assert refused.returncode == 1
    assert "holds data but no meta.properties" in refused.stderr
    assert "--ignore-formatted" in refused.stderr
    out = kraft("storage", "format", "--config", config_of(cluster, 2), "--ignore-formatted").stdout
    assert "adopted existing data" in out
    cluster.start(2)
    poll(lambda: converged(cluster, [1, 2, 3]), 60, what="controller 2 back with its data")
    assert "kept" in topic_names(cluster)


def test_another_clusters_directory_is_refused(cluster: LocalCluster) -> None:
    cluster.kill(3, "TERM")
    other = uuid.uuid4().hex[:22]
    mp.write(meta_dir(cluster, 3), mp.MetaProperties(other, 3, mp.random_uuid()))
    refused = run_controller(cluster, 3)
    assert refused.returncode == 1
    assert f"belongs to cluster {other!r}" in refused.stderr


def test_a_wiped_voter_formatted_as_a_new_member_is_unverified_until_caught_up(
    cluster: LocalCluster,
) -> None:
    """The operator's mistake: a wiped controller formatted with --initial-controllers. The
    others notice its new directory id and ignore its votes until it has caught up."""
    assert create_topic(cluster, "x")
    poll(lambda: converged(cluster, [1, 2, 3]), 60, what="all three agree")
    old_id = describe(cluster, 3)["directory_id"]
    state = {n: meta_dir(cluster, n) / "quorum-state.properties" for n in (1, 2)}
    for path in state.values():
        poll(lambda p=path: f"voter.3.directory.id={old_id}" in p.read_text(), 30, what="record")
    cluster.kill(3, "TERM")
    shutil.rmtree(meta_dir(cluster, 3))
    kraft("storage", "format", "--config", config_of(cluster, 3), "--initial-controllers")
    new_id = mp.read(meta_dir(cluster, 3)).directory_id
    assert new_id != old_id
    cluster.start(3)
    for n in (1, 2):
        log = Path(cluster.controller(n)["log_file"])
        poll(
            lambda log=log: (
                f"controller 3 presents directory id {new_id}, not {old_id}" in log.read_text()
            ),
            60,
            what=f"controller {n} noticed the new directory",
        )
        poll(
            lambda log=log: "controller 3 caught up with its new directory" in log.read_text(),
            60,
            what=f"controller {n} verified it",
        )
        assert f"voter.3.directory.id={new_id}" in state[n].read_text()
    poll(lambda: converged(cluster, [1, 2, 3]), 60, what="one history")
    assert "x" in topic_names(cluster)


def test_a_broker_whose_log_dir_fills_asks_to_be_fenced_and_exits(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """A partition-log write error stops the broker (exit 3), and before it goes it asks the
    active controller to fence it (BrokerHeartbeat want_fence): the fence is in the log with
    reason "requested", not left to the session timeout."""
    from confluent_kafka import Producer

    from kraft.log.metadata_log import MetadataLog

    broker = cluster.meta["brokers"][0]
    config = Path(broker["config"])
    log_dir = Path(broker["log_dirs"].split(",")[0])
    assert cluster.dir in log_dir.parents, log_dir  # it is about to be emptied and mounted over
    cluster.kill(broker["id"], "TERM")
    poll(lambda: not pid_alive(broker["pid"]), 60, what="the broker stopped")
    saved = tmp_path / "saved-logs"
    shutil.copytree(log_dir, saved)
    shutil.rmtree(log_dir)
    if not _mount_tmpfs(log_dir, "6m"):
        pytest.skip("mounting a tmpfs needs root (the full disk is a real ENOSPC)")
    proc = None
    try:
        shutil.copytree(saved, log_dir, dirs_exist_ok=True)
        stderr = tmp_path / "broker.err"
        with open(stderr, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tools.cli", "broker", "--config", str(config)],
                cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip

        def unfenced() -> bool:
            brokers = call_sync(cluster_rpc(cluster), "DescribeCluster", {}, 5.0)["brokers"]
            return not any(b["fenced"] for b in brokers)

        poll(unfenced, 60, what="the broker registered and unfenced")
        assert create_topic(cluster, "fills")
        producer = Producer(
            {"bootstrap.servers": f"{broker['host']}:{broker['port']}", "acks": "1"}
        )
        payload = bytes(100_000)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            for _ in range(20):
                try:
                    producer.produce("fills", payload)
                except BufferError:
                    break
            producer.poll(0.2)
        assert proc.wait(30) == 3, "the broker kept running on a full log dir"
        text = stderr.read_text(errors="replace")
        assert "fatal storage error" in text and "No space left on device" in text, text
        assert "asked the controller to fence it" in text, text
        leader = cluster.active_controller()

        def fenced_on_request() -> bool:
            with MetadataLog.open(cluster.log_dir(leader), fsync="never") as mlog:
                return any(
                    b.provenance.api == "FenceBroker" and b.provenance.reason == "requested"
                    for b in mlog.read_batches(mlog.start_offset)
                )

        poll(fenced_on_request, 30, what="a FenceBroker batch with reason 'requested'")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        subprocess.run(["umount", "-l", str(log_dir)], capture_output=True, timeout=30)


def cluster_rpc(cluster: LocalCluster) -> list[tuple[str, int]]:
    return [(c["host"], c["rpc_port"]) for c in cluster.meta["controllers"]]


def pid_alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet has exited)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ---- one of several log dirs fails (JBOD) -----------------------------------------------------


@pytest.fixture()
def jbod_cluster(tmp_path: Path):
    c = LocalCluster(tmp_path / "j")
    try:
        yield c.up(1, 2, "--no-auth")  # one controller: leadership moves between two brokers
    finally:
        c.down()


def test_a_broker_whose_second_log_dir_fills_keeps_serving_the_first_and_loses_no_acked_write(
    jbod_cluster: LocalCluster, tmp_path: Path
) -> None:
    """Broker A gets a second log dir on a small tmpfs and leads four partitions, two in each
    dir (replicas [A, B]). Filling the tmpfs makes a produce fail there: A takes only that dir
    offline (it keeps running and leading the other two), its heartbeat reports it, and the
    controller moves the two partitions' leadership to B and A out of their ISRs. Every
    acks=all write acknowledged before and after is read back. Freed and restarted, A serves
    the directory again and rejoins those ISRs."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from broker.state import describe as describe_broker
    from kraft.config import load_properties, write_properties

    cluster = jbod_cluster
    a, b = cluster.meta["brokers"]
    rpc = cluster_rpc(cluster)
    data = Path(a["log_dirs"])
    data2 = data.parent / "data2"
    cluster.kill(a["id"], "TERM")
    poll(lambda: not pid_alive(a["pid"]), 60, what="broker A stopped")
    if not _mount_tmpfs(data2, "4m"):
        pytest.skip("mounting a tmpfs needs root (the full disk is a real ENOSPC)")
    try:
        own = mp.read(data)
        assert own is not None
        mp.write(data2, mp.MetaProperties(own.cluster_id, own.node_id, mp.random_uuid()))
        props = load_properties(a["config"])
        props["log.dirs"] = f"{data},{data2}"
        write_properties(a["config"], props)
        cluster.start(a["id"])
        a = next(x for x in cluster.meta["brokers"] if x["id"] == a["id"])  # its new pid

        def brokers() -> dict[int, dict[str, Any]]:
            out = call_sync(rpc, "DescribeCluster", {}, 5.0)["brokers"]
            return {x["broker_id"]: x for x in out}

        poll(lambda: not any(x["fenced"] for x in brokers().values()), 60, what="both unfenced")
        assignments = {p: [a["id"], b["id"]] for p in range(4)}
        created = call_sync(
            rpc, "CreateTopics", {"topics": [{"name": "jbod", "assignments": assignments}]}, 10.0
        )
        assert created["topics"][0]["error_code"] == 0, created

        def partitions() -> dict[int, dict[str, Any]]:
            (topic,) = call_sync(rpc, "DescribeTopics", {"names": ["jbod"]}, 5.0)["topics"]
            return {p["partition"]: p for p in topic["partitions"]}

        def a_state() -> dict[str, Any]:
            return describe_broker(a["host"], a["admin_port"])

        def dirs_of_a() -> dict[int, str]:
            return {
                p["partition"]: str(Path(p["dir"]).parent)
                for p in a_state()["partitions"]
                if p["topic"] == "jbod"
            }

        poll(lambda: len(dirs_of_a()) == 4, 30, what="A opened the four partitions")
        homes = dirs_of_a()
        on_tmpfs = sorted(p for p, d in homes.items() if d == str(data2))
        on_disk = sorted(p for p, d in homes.items() if d == str(data))
        assert len(on_tmpfs) == 2 and len(on_disk) == 2, homes
        poll(lambda: all(p["isr"] == [a["id"], b["id"]] for p in partitions().values()), 30,
             what="B in every ISR")  # fmt: skip

        acked: set[tuple[int, bytes]] = set()

        def delivered(err: Any, msg: Any) -> None:
            if err is None:
                acked.add((msg.partition(), msg.value()))

        producer = Producer(
            {
                "bootstrap.servers": f"{a['host']}:{a['port']},{b['host']}:{b['port']}",
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 30000,
            }
        )

        def produce(tag: str, count: int, size: int = 100) -> None:
            for i in range(count):
                for p in range(4):
                    producer.produce("jbod", f"{tag}-{p}-{i}".encode().ljust(size, b"."),
                                     partition=p, on_delivery=delivered)  # fmt: skip
            producer.flush(30)

        produce("before", 5)
        assert len(acked) == 20, sorted(acked)
        _fill(data2)
        sent = 0
        deadline = time.monotonic() + 30
        log_file = Path(a["log_file"])
        while f"log dir {data2} is offline" not in log_file.read_text(errors="replace"):
            assert time.monotonic() < deadline, "the full log dir was never taken offline"
            for p in on_tmpfs:
                producer.produce("jbod", bytes(20_000), partition=p, on_delivery=delivered)
                sent += 1
            producer.poll(0.1)
        assert pid_alive(a["pid"]), "broker A stopped instead of taking one log dir offline"

        def moved() -> bool:
            parts = partitions()
            return all(
                parts[p]["leader"] == b["id"] and a["id"] not in parts[p]["isr"] for p in on_tmpfs
            ) and all(parts[p]["leader"] == a["id"] for p in on_disk)

        poll(moved, 30, what="the full dir's partitions led by B, the others still by A")
        poll(lambda: brokers()[a["id"]]["offline_log_dirs"] == [str(data2)], 30,
             what="the controller shows A's dir offline")  # fmt: skip
        assert brokers()[a["id"]]["offline_replicas"] == 2 and not brokers()[a["id"]]["fenced"]
        state = a_state()
        assert [d["offline"] for d in state["log_dirs"]] == [False, True], state["log_dirs"]
        assert state["offline_partitions"] == 2

        produce("after", 5)
        producer.flush(30)
        expected_after = {(p, f"after-{p}-{i}".encode().ljust(100, b".")) for p in range(4)
                          for i in range(5)}  # fmt: skip
        assert expected_after <= acked, sorted(expected_after - acked)
        assert "Traceback" not in log_file.read_text(errors="replace")

        consumer = Consumer(
            {
                "bootstrap.servers": f"{b['host']}:{b['port']}",
                "group.id": "jbod-check",
                "enable.auto.commit": False,
            }
        )
        try:
            consumer.assign([TopicPartition("jbod", p, 0) for p in range(4)])
            read: set[tuple[int, bytes]] = set()
            deadline = time.monotonic() + 30
            while not acked <= read and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    read.add((msg.partition(), msg.value()))
            assert acked <= read, f"{len(acked - read)} acknowledged writes lost"
        finally:
            consumer.close()
        # freed and restarted, the directory serves again: A fetches back into the ISRs it left
        (data2 / "filler").unlink()
        cluster.kill(a["id"], "TERM")
        poll(lambda: not pid_alive(a["pid"]), 60, what="broker A stopped again")
        cluster.start(a["id"])
        poll(lambda: all(a["id"] in p["isr"] for p in partitions().values()), 60,
             what="A back in every ISR")  # fmt: skip
        assert brokers()[a["id"]]["offline_log_dirs"] == []
    finally:
        cluster.down()
        subprocess.run(["umount", "-l", str(data2)], capture_output=True, timeout=30)
