"""The log tools on a real cluster (a controller and 3 brokers on loopback), one cluster for the
module: ``log dump`` of a running controller's log matches ``topics describe``, a flipped byte is
reported with its file and offset, ``log diff`` over a broker kill lists the fence, the elections
and the ISR shrinks with their reasons, and the shell reproduces both states live and offline."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.harness import LocalCluster, kraft, kraft_json, poll
from tools.cli import main
from tools.commands.log_cmd import dump_items

pytestmark = pytest.mark.integration


def dump(path) -> list[dict]:
    """``kraft log dump PATH --json`` objects, in-process (the CLI runs it in the tests below)."""
    return list(dump_items(path))


def last_offset(path) -> int:
    return dump(path)[-1]["last_offset"]


def fenced_in_log(path, broker_id: int) -> bool:
    return any(
        i["kind"] == "record"
        and i["record"]["type"] == "BrokerRegistrationChangeRecord"
        and i["record"]["broker_id"] == broker_id
        and i["record"]["fenced"] == 1
        for i in dump(path)
    )


def describe(cluster: LocalCluster) -> dict:
    return kraft_json("topics", "describe", "orders", "--cluster", str(cluster.dir))


def fold_partitions(items: list[dict], topic_id: str) -> dict[int, dict]:
    """Partition state from the dumped records alone (PartitionRecord, then each change)."""
    parts: dict[int, dict] = {}
    for item in items:
        r = item.get("record") if item["kind"] == "record" else None
        if r is None or r.get("topic_id") != topic_id:
            continue
        if r["type"] == "PartitionRecord":
            parts[r["partition_id"]] = {
                k: r[k] for k in ("leader", "leader_epoch", "partition_epoch", "replicas", "isr")
            }
        elif r["type"] == "PartitionChangeRecord":
            p = parts[r["partition_id"]]
            p["partition_epoch"] += 1
            if r["leader"] != -2:
                p["leader"], p["leader_epoch"] = r["leader"], p["leader_epoch"] + 1
            for key in ("isr", "replicas"):
                if r[key] is not None:
                    p[key] = r[key]
    return parts


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    """Topics and a config, then SIGKILL the leader of orders-0 and wait for its fence."""
    cluster = LocalCluster(tmp_path_factory.mktemp("logtools") / "cluster")
    cluster.up(1, 3, "--fsync", "never")
    try:
        d = str(cluster.dir)
        kraft(
            "topics",
            "create",
            "orders",
            "--partitions",
            "3",
            "--replication-factor",
            "3",
            "--cluster",
            d,
        )
        kraft("configs", "alter", "--topic", "orders", "--set", "retention.ms=1000", "--cluster", d)
        before = describe(cluster)
        log_dir = cluster.log_dir(1)
        poll(
            lambda: last_offset(log_dir) >= before["offset"],
            30,
            what="controller 1's log to catch up",
        )
        pre_offset = last_offset(log_dir)
        victim = before["topics"][0]["partitions"][0]["leader"]
        cluster.kill(victim)
        poll(
            lambda: fenced_in_log(log_dir, victim), 60, interval=0.5, what=f"broker {victim} fenced"
        )
        after = describe(cluster)
        yield {
            "cluster": cluster,
            "log_dir": log_dir,
            "before": before,
            "after": after,
            "pre_offset": pre_offset,
            "victim": victim,
        }
    finally:
        cluster.down()


def test_dump_of_a_running_controllers_log_matches_topics_describe(scenario):
    items = dump(scenario["log_dir"])
    assert items[-1]["kind"] == "summary"
    assert [i for i in items if i["kind"] == "problem" and i["problem"] != "torn"] == []
    topic = scenario["after"]["topics"][0]
    created = [i for i in items if i["kind"] == "record" and i["record"]["type"] == "TopicRecord"]
    assert [c["record"]["topic_id"] for c in created] == [topic["topic_id"]]
    assert (
        created[0]["provenance"]["api"] == "CreateTopics"
        and created[0]["provenance"]["client_id"] == "kraft-cli"
    )
    folded = fold_partitions(items, topic["topic_id"])
    described = {
        p["partition"]: {
            k: p[k] for k in ("leader", "leader_epoch", "partition_epoch", "replicas", "isr")
        }
        for p in topic["partitions"]
    }
    assert folded == described
    configs = [
        i["record"]
        for i in items
        if i["kind"] == "record" and i["record"]["type"] == "ConfigRecord"
    ]
    assert [(c["resource_name"], c["name"], c["value"]) for c in configs] == [
        ("orders", "retention.ms", "1000")
    ]


def test_flipped_byte_is_reported_with_file_and_offset(scenario, tmp_path):
    copy = tmp_path / "log"
    shutil.copytree(scenario["log_dir"], copy)
    items = dump(copy)
    created = next(
        i for i in items if i["kind"] == "record" and i["record"]["type"] == "TopicRecord"
    )
    segment = copy / created["file"].rsplit("/", 1)[1]
    data = bytearray(segment.read_bytes())
    data[created["position"] + 20] ^= 0x10
    segment.write_bytes(bytes(data))

    proc = kraft("log", "dump", str(copy), check=False)
    assert proc.returncode == 1
    where = f"{segment.name} byte {created['position']} (offset {created['batch_offset']})"
    assert f"PROBLEM: CRC mismatch at {where}" in proc.stdout
    items = dump(copy)
    problems = [i for i in items if i["kind"] == "problem" and i["problem"] != "torn"]
    assert [(p["problem"], p["file"], p["offset"]) for p in problems] == [
        ("crc", str(segment), created["batch_offset"])
    ]
    assert items[-1]["last_offset"] >= scenario["after"]["offset"]  # read on past the damage


def test_diff_over_the_broker_kill_lists_fence_elections_and_isr_shrinks(scenario, capsys):
    victim, d = scenario["victim"], scenario["log_dir"]
    doc = kraft_json("log", "diff", str(d), "--from", str(scenario["pre_offset"]))
    changes = doc["changes"]
    fence = [c for c in changes if c["kind"] == "broker-fenced"]
    assert [(c["broker_id"], c["api"], c["reason"]) for c in fence] == [
        (victim, "FenceBroker", "session-timeout")
    ]
    before = {p["partition"]: p for p in scenario["before"]["topics"][0]["partitions"]}
    parts = {
        c["partition"]: c
        for c in changes
        if c["kind"] == "partition-changed" and c["topic"] == "orders"
    }
    assert set(parts) == {pid for pid, p in before.items() if victim in p["isr"]}
    for pid, c in parts.items():
        assert "isr-shrink" in c["changes"] and victim not in c["isr"][1]
        assert (c["api"], c["reason"]) == ("FenceBroker", "session-timeout")
        if before[pid]["leader"] == victim:
            assert "leader-election" in c["changes"] and c["election"] == "clean"
            assert c["leader"][0] == victim and c["leader"][1] not in (victim, -1)
            assert c["leader_epoch"] == [
                before[pid]["leader_epoch"],
                before[pid]["leader_epoch"] + 1,
            ]
    assert doc["summary"]["leader-elections"] >= 1
    text = kraft("log", "diff", str(d), "--from", str(scenario["pre_offset"])).stdout
    assert (
        f"broker {victim} fenced" in text
        and "by controller via FenceBroker: session-timeout" in text
    )
    assert "clean election" in text and "ISR shrink" in text
    live = kraft_json(
        "log",
        "diff",
        "--cluster",
        str(scenario["cluster"].dir),
        "--from",
        str(scenario["pre_offset"]),
    )
    assert [c for c in live["changes"] if c["offset"] <= changes[-1]["offset"]] == changes
    # the same window by time: from the time of the pre-kill point (ISO-8601)
    pre_time = next(
        i["time"]
        for i in dump(d)
        if i["kind"] == "record" and i["offset"] == scenario["pre_offset"]
    )
    assert main(["log", "diff", str(d), "--from", pre_time, "--json"]) == 0
    by_time = json.loads(capsys.readouterr().out)
    assert [c for c in by_time["changes"] if c["kind"] != "controller-activated"] == [
        c for c in changes if c["kind"] != "controller-activated"
    ]


def test_shell_live_and_offline_at_offset(scenario):
    cluster, victim = scenario["cluster"], scenario["victim"]
    out = kraft(
        "shell",
        "--cluster",
        str(cluster.dir),
        "-c",
        "ls /topics; ls /topics/orders; cat /topics/orders/0/leader; cat /brokers/%d/state"
        % victim,
    ).stdout
    p0 = scenario["after"]["topics"][0]["partitions"][0]
    assert out.splitlines() == [
        "orders/",
        "topic_id",
        "0/",
        "1/",
        "2/",
        str(p0["leader"]),
        "fenced",
    ]
    # the state before the kill, offline from the running controller's directory and live
    script = "cat /topics/orders/0/leader; cat /topics/orders/0/isr; cat /brokers/%d/state" % victim
    p0_before = scenario["before"]["topics"][0]["partitions"][0]
    expected = [str(victim), ",".join(map(str, p0_before["isr"])), "unfenced"]
    for source in (["--cluster", str(cluster.dir)], [str(scenario["log_dir"])]):
        out = kraft(
            "shell", *source, "--at-offset", str(scenario["pre_offset"]), "-c", script
        ).stdout
        assert out.splitlines() == expected, source
