"""The kraft command line: parsing, request bodies, output and exit codes (no controller needed:
the RPC call is replaced by a fake that records requests and returns canned responses)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from kraft.errors import ErrorCode, KraftError
from tools import cli
from tools.cluster import plan_cluster, write_cluster_json
from tools.commands import common
from tools.commands.common import UsageError, parse_endpoint, parse_endpoints, parse_key_values
from tools.commands.topics import parse_replica_assignment

BOOT = ["--bootstrap-controller", "127.0.0.1:9093"]


class FakeRpc:
    """Records calls; answers from ``responses[api]`` (a dict, or a KraftError to raise)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[tuple[str, int]], str, dict, float]] = []
        self.responses: dict[str, Any] = {}

    def __call__(
        self,
        bootstrap: list[tuple[str, int]],
        api: str,
        body: dict,
        timeout: float,
        credentials: Any = None,
    ) -> dict:
        self.calls.append((bootstrap, api, body, timeout))
        self.credentials = credentials
        answer = self.responses.get(api, {})
        if isinstance(answer, Exception):
            raise answer
        return answer

    @property
    def body(self) -> dict:
        return self.calls[-1][2]


@pytest.fixture
def rpc(monkeypatch: pytest.MonkeyPatch) -> FakeRpc:
    fake = FakeRpc()
    monkeypatch.setattr(common, "call_endpoints", fake)
    monkeypatch.delenv(common.BOOTSTRAP_ENV, raising=False)
    monkeypatch.delenv(common.CLUSTER_DIR_ENV, raising=False)
    return fake


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- help and usage ---------------------------------------------------------------------------

HELP_COMMANDS = [
    [],
    ["controller"],
    ["broker"],
    ["cluster"],
    ["cluster", "up"],
    ["cluster", "down"],
    ["cluster", "start"],
    ["cluster", "kill"],
    ["cluster", "status"],
    ["cluster", "describe"],
    ["quorum"],
    ["quorum", "status"],
    ["topics"],
    ["topics", "create"],
    ["topics", "list"],
    ["topics", "describe"],
    ["topics", "delete"],
    ["topics", "add-partitions"],
    ["topics", "delete-records"],
    ["configs"],
    ["configs", "describe"],
    ["configs", "alter"],
]


@pytest.mark.parametrize("words", HELP_COMMANDS, ids=lambda w: " ".join(w) or "kraft")
def test_every_command_has_a_manual(capsys: pytest.CaptureFixture, words: list[str]) -> None:
    code, out, _ = run(capsys, *words, "--help")
    assert code == 0
    assert out.startswith("usage: kraft")
    if len(words) != 1 or words[0] in ("controller", "broker", "cluster"):
        assert "example" in out


def test_unknown_command_and_missing_arguments_are_usage_errors(
    capsys: pytest.CaptureFixture,
) -> None:
    assert run(capsys, "frobnicate")[0] == 2
    assert run(capsys)[0] == 2
    assert run(capsys, "topics")[0] == 2
    assert run(capsys, "topics", "add-partitions", "t", *BOOT)[0] == 2  # --partitions required
    assert run(capsys, "topics", "create", "t", "--partitions", "0", *BOOT)[0] == 2
    assert run(capsys, "topics", "list", "--timeout", "-1", *BOOT)[0] == 2
    assert run(capsys, "cluster", "up", "--dir", "x")[0] == 2  # --controllers required


def test_bootstrap_and_cluster_are_mutually_exclusive(
    capsys: pytest.CaptureFixture, rpc: FakeRpc
) -> None:
    assert run(capsys, "topics", "list", *BOOT, "--cluster", "/tmp")[0] == 2
    assert rpc.calls == []


def test_no_controller_given_is_a_usage_error(capsys: pytest.CaptureFixture, rpc: FakeRpc) -> None:
    code, _, err = run(capsys, "topics", "list")
    assert code == 2
    assert "--bootstrap-controller" in err and "kraft topics list --help" in err


def test_version(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.startswith("kraft ")


# ---- endpoints and bootstrap --------------------------------------------------------------------


def test_parse_endpoints() -> None:
    assert parse_endpoint("127.0.0.1:9093") == ("127.0.0.1", 9093)
    assert parse_endpoint(" [::1]:9093 ") == ("::1", 9093)
    assert parse_endpoints("a:1,b:2,") == [("a", 1), ("b", 2)]
    for bad in ("nohost", ":9", "a:b", "a:0", "a:70000"):
        with pytest.raises(UsageError):
            parse_endpoint(bad)
    with pytest.raises(UsageError):
        parse_endpoints(" , ")


def test_bootstrap_controller_list_and_timeout_reach_the_call(
    capsys: pytest.CaptureFixture, rpc: FakeRpc
) -> None:
    rpc.responses["ListTopics"] = {"offset": 3, "topics": []}
    code, out, _ = run(
        capsys, "topics", "list", "--bootstrap-controller", "h1:1,h2:2", "--timeout", "2.5"
    )
    assert code == 0
    assert rpc.calls == [([("h1", 1), ("h2", 2)], "ListTopics", {}, 2.5)]
    assert out.strip() == "No topics."


def test_cluster_dir_gives_every_controller_endpoint(
    capsys: pytest.CaptureFixture, rpc: FakeRpc, tmp_path: Path
) -> None:
    layout = plan_cluster(tmp_path, 3, 1)
    write_cluster_json(tmp_path, layout)
    run(capsys, "topics", "list", "--cluster", str(tmp_path))
    assert rpc.calls[0][0] == [("127.0.0.1", c.rpc_port) for c in layout.controllers]


def test_cluster_dir_without_cluster_json_is_a_usage_error(
    capsys: pytest.CaptureFixture, rpc: FakeRpc, tmp_path: Path
) -> None:
    code, _, err = run(capsys, "topics", "list", "--cluster", str(tmp_path))
    assert code == 2 and "cluster.json" in err


def test_bootstrap_from_environment(
    capsys: pytest.CaptureFixture, rpc: FakeRpc, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(common.BOOTSTRAP_ENV, "envhost:7")
    run(capsys, "quorum", "status")
    assert rpc.calls[0][0] == [("envhost", 7)]


def test_transport_errors_become_kafka_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any, **__: Any) -> dict:
        raise ConnectionRefusedError(111, "Connection refused")

    fake_client = types.ModuleType("kraft.rpc.client")
    fake_client.call_sync = refuse  # type: ignore[attr-defined]  # replace the real client in this test
    monkeypatch.setitem(sys.modules, "kraft.rpc.client", fake_client)
    with pytest.raises(KraftError) as info:
        common.call_endpoints([("h", 1)], "ListTopics", {}, 1.0)
    assert info.value.code == ErrorCode.NETWORK_EXCEPTION and "h:1" in info.value.message


# ---- whole-request errors -------------------------------------------------------------------------


def test_kafka_error_prints_name_and_exits_1(capsys: pytest.CaptureFixture, rpc: FakeRpc) -> None:
    rpc.responses["ListTopics"] = KraftError(ErrorCode.REQUEST_TIMED_OUT, "no answer")
    code, out, err = run(capsys, "topics", "list", *BOOT)
    assert code == 1
    assert out == ""
    assert err.strip() == "Error: REQUEST_TIMED_OUT: no answer"


def test_kafka_error_with_json_prints_error_document(
    capsys: pytest.CaptureFixture, rpc: FakeRpc
) -> None:
    rpc.responses["DescribeQuorum"] = KraftError(ErrorCode.NOT_CONTROLLER, "no leader")
    code, out, err = run(capsys, "quorum", "status", *BOOT, "--json")
    assert code == 1
    assert json.loads(out) == {"error": "NOT_CONTROLLER", "error_code": 41, "message": "no leader"}
    assert "Error: NOT_CONTROLLER: no leader" in err


# ---- topics -----------------------------------------------------------------------------------------


def test_parse_replica_assignment() -> None:
    assert parse_replica_assignment("1:2:3,2:3:1") == [[1, 2, 3], [2, 3, 1]]
    assert parse_replica_assignment(" 101 ") == [[101]]
    for bad in ("", "1:2,", "1:x", "1:1", "1:2,3", "-1", "1;2"):
        with pytest.raises(UsageError):
            parse_replica_assignment(bad)


def test_create_with_counts_and_configs(capsys: pytest.CaptureFixture, rpc: FakeRpc) -> None:
    rpc.responses["CreateTopics"] = {
        "topics": [
            {
                "name": "orders",
                "topic_id": "abc",
                "error_code": 0,
                "error_message": None,
                "num_partitions": 6,
                "replication_factor": 3,
            }
        ]
    }
    code, out, _ = run(
        capsys,
        "topics",
        "create",
        "orders",
        "--partitions",
        "6",
        "--replication-factor",
        "3",
        "--config",
        "retention.ms=1000",
        "--config",
        "x.list=a,b=c",
        *BOOT,
    )
    assert code == 0
    assert rpc.calls[0][1] == "CreateTopics"
    assert rpc.body == {
        "topics": [
            {
                "name": "orders",
                "num_partitions": 6,
                "replication_factor": 3,
                "configs": {"retention.ms": "1000", "x.list": "a,b=c"},
            }
        ],
        "validate_only": False,
    }
    assert "Created topic orders with 6 partition(s), replication factor 3, id abc." in out


def test_create_defaults_to_controller_settings(
    capsys: pytest.CaptureFixture, rpc: FakeRpc
) -> None:
    run(capsys, "topics", "create", "t", "--validate-only", *BOOT)
    assert rpc.body == {
        "topics": [{"name": "t", "num_partitions": -1, "replication_factor": -1}],
        "validate_only": True,
    }


def test_create_with_replica_assignment(capsys: pytest.CaptureFixture, rpc: FakeRpc) -> None:
    run(capsys, "topics", "create", "t", "--replica-assignment", "1:2,2:3", *BOOT)
    assert rpc.body["topics"][0] == {
        "name": "t",
        "num_partitions": -1,
        "replication_factor": -1,
        "assignments": {0: [1, 2], 1: [2, 3]},
    }


def test_create_assignment_conflicts_with_counts(
    capsys: pytest.CaptureFixture, rpc: FakeRpc
) -> None:
    code, _, err = run(
        capsys, "topics", "create", "t", "--replica-assignment", "1:2", "--partitions", "2", *BOOT
    )
    assert code == 2 and "--replica-assignment" in err
    assert rpc.calls == []


def test_bad_config_option_is_a_usage_error(capsys: pytest.CaptureFixture, rpc: FakeRpc) -> None:
    assert run(capsys, "topics", "create", "t", "--config", "novalue", *BOOT)[0] == 2
    with pytest.raises(UsageError):
        parse_key_values(["=x"], "--config")


def test_create_existing_topic(capsys: pytest.CaptureFixture, rpc: FakeRpc) -> None:
    rpc.responses["CreateTopics"] = {
        "topics": [
            {
                "name": "t",
                "topic_id": None,
                "error_code": 36,
                "error_message": "Topic 't' already exists.",
            }
        ]
    }
    code, out, err = run(capsys, "topics", "create", "t", *BOOT)
    assert code == 1
    assert "Error: TOPIC_ALREADY_EXISTS: topic t: Topic 't' already exists." in err
    code, out, err = run(capsys, "topics", "create", "t", "--if-not-exists", *BOOT)
    assert code == 0 and "already exists" in out and err == ""


def test_create_json_annotates_error_names(capsys: pytest.CaptureFixture, rpc: FakeRpc) -> None:
    rpc.responses["CreateTopics"] = {
        "topics": [{"name": "t", "error_code": 37, "error_message": "bad"}]
    }
    code, out, err = run(capsys, "topics", "create", "t", *BOOT, "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["topics"][0]["error"] == "INVALID_PARTITIONS"
    assert doc["topics"][0]["error_code"] == 37
    assert err == ""


def test_delete_reports_each_topic(capsys: pytest.CaptureFixture, rpc: FakeRpc) -> None:
    rpc.responses["DeleteTopics"] = {
        "topics": [
            {"name": "a", "topic_id": "x", "error_code": 0, "error_message": None},
            {"name": "b", "topic_id": None, "error_code": 3, "error_message": "unknown topic b"},
        ]
    }
    code, out, err = run(capsys, "topics", "delete", "a", "b", *BOOT)
    assert rpc.body == {"names": ["a", "b"]}
    assert code == 1
    assert "Deleted topic a." in out
    assert "Error: UNKNOWN_TOPIC_OR_PARTITION: topic b: unknown topic b" in err
    code, out, err = run(capsys, "topics", "delete", "a", "b", "--if-exists", *BOOT)
    assert code == 0 and "Topic b does not exist." in out


def test_list_table_sorted(capsys: pytest.CaptureFixture, rpc: FakeRpc) -> None:
    rpc.responses["ListTopics"] = {
        "offset": 9,
        "topics": [
            {"name": "zeta", "topic_id": "id-z", "partitions": 1},
            {"name": "alpha", "topic_id": "id-a", "partitions": 12},
        ],
    }
    code, out, _ = run(capsys, "topics", "list", *BOOT)
    assert code == 0
    assert out.splitlines() == [
        "NAME   TOPIC ID  PARTITIONS",
        "alpha  id-a              12",
        "zeta   id-z               1",
    ]
    code, out, _ = run(capsys, "topics", "list", *BOOT, "--json")
    assert json.loads(out) == rpc.responses["ListTopics"]


DESCRIBE = {
    "offset": 20,
    "topics": [
        {
            "name": "orders",
            "topic_id": "tid",
            "error_code": 0,
            "error_message": None,
            "configs": {"retention.ms": "5"},
            "partitions": [
                {
                    "partition": 1,
                    "leader": -1,
                    "leader_epoch": 4,
                    "partition_epoch": 7,
                    "replicas": [2, 3],
                    "isr": [],
                    "removing_replicas": [],
                    "adding_replicas": [],
                    "leader_recovery_state": 0,
                },
                {
                    "partition": 0,
                    "leader": 1,
                    "leader_epoch": 2,
                    "partition_epoch": 3,
                    "replicas": [1, 2],
                    "isr": [1, 2],
                    "removing_replicas": [],
                    "adding_replicas": [3],
                    "leader_recovery_state": 0,
                },
            ],
        },
        {
            "name": "nope",
            "topic_id": None,
            "error_code": 3,
            "error_message": "no such topic",
            "configs": {},
            "partitions": [],
        },
    ],
}


def test_describe_shows_partitions_and_item_errors(
    capsys: pytest.CaptureFixture, rpc: FakeRpc
) -> None:
    rpc.responses["DescribeTopics"] = DESCRIBE
    code, out, err = run(capsys, "topics", "describe", "orders", "nope", *BOOT)
    assert rpc.body == {"names": ["orders", "nope"]}
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == (
        "Topic: orders  TopicId: tid  PartitionCount: 2  ReplicationFactor: 2  "
        "Configs: retention.ms=5"
    )
    assert lines[1].split() == [
        "PARTITION",
        "LEADER",
        "LEADER",
        "EPOCH",
        "REPLICAS",
        "ISR",
        "NOTES",
    ]
    assert lines[2].split() == ["0", "1", "2", "1,2", "1,2", "adding=3"]
    assert lines[3].split() == ["1", "none", "4", "2,3", "-", "-"]
    assert "Error: UNKNOWN_TOPIC_OR_PARTITION: topic nope: no such topic" in err


def test_describe_all_sends_null_names(capsys: pytest.CaptureFixture, rpc: FakeRpc) -> None:
    rpc.responses["DescribeTopics"] = {"offset": 0, "topics": []}
    code, out, _ = run(capsys, "topics", "describe", *BOOT)
    assert code == 0 and rpc.body == {"names": None} and out.strip() == "No topics."


def test_add_partitions(capsys: pytest.CaptureFixture, rpc: FakeRpc) -> None:
    rpc.responses["CreatePartitions"] = {
        "topics": [{"name": "t", "error_code": 0, "error_message": None}]
    }
    code, out, _ = run(
        capsys,
        "topics",
        "add-partitions",
        "t",
        "--partitions",
        "4",
        "--replica-assignment",
        "1:2,2:1",
        *BOOT,
    )
    assert code == 0
    assert rpc.body == {
        "topics": [{"name": "t", "count": 4, "assignments": [[1, 2], [2, 1]]}],
        "validate_only": False,
    }
    assert "now has 4 partition(s)" in out


# ---- configs ------------------------------------------------------------------------------------------


def test_configs_resource_selection(capsys: pytest.CaptureFixture, rpc: FakeRpc) -> None:
    rpc.responses["DescribeConfigs"] = {"offset": 1, "resources": []}
    run(capsys, "configs", "describe", "--topic", "t", *BOOT)
    assert rpc.body == {"resources": [{"resource_type": "topic", "resource_name": "t"}]}
    run(capsys, "configs", "describe", "--broker", "101", *BOOT)
    assert rpc.body == {"resources": [{"resource_type": "broker", "resource_name": "101"}]}
    run(capsys, "configs", "describe", "--broker-defaults", *BOOT)
    assert rpc.body == {"resources": [{"resource_type": "broker", "resource_name": ""}]}
    assert run(capsys, "configs", "describe", *BOOT)[0] == 2
    assert run(capsys, "configs", "describe", "--topic", "t", "--broker", "1", *BOOT)[0] == 2


def test_configs_describe_table(capsys: pytest.CaptureFixture, rpc: FakeRpc) -> None:
    rpc.responses["DescribeConfigs"] = {
        "offset": 1,
        "resources": [
            {
                "resource_type": "topic",
                "resource_name": "t",
                "error_code": 0,
                "error_message": None,
                "configs": [
                    {
                        "name": "retention.ms",
                        "value": "10",
                        "source": "dynamic",
                        "read_only": False,
                        "sensitive": False,
                    },
                    {
                        "name": "cleanup.policy",
                        "value": "delete",
                        "source": "default",
                        "read_only": True,
                        "sensitive": False,
                    },
                    {
                        "name": "secret",
                        "value": None,
                        "source": "dynamic",
                        "read_only": False,
                        "sensitive": True,
                    },
                ],
            }
        ],
    }
    code, out, _ = run(capsys, "configs", "describe", "--topic", "t", *BOOT)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "Configs for topic t:"
    assert lines[2].split() == ["cleanup.policy", "delete", "default", "read-only"]
    assert lines[4].split() == ["secret", "(sensitive)", "dynamic", "-"]


def test_configs_alter_ops(capsys: pytest.CaptureFixture, rpc: FakeRpc) -> None:
    rpc.responses["IncrementalAlterConfigs"] = {
        "resources": [
            {"resource_type": "topic", "resource_name": "t", "error_code": 0, "error_message": None}
        ]
    }
    code, out, _ = run(
        capsys,
        "configs",
        "alter",
        "--topic",
        "t",
        "--set",
        "a=1",
        "--set",
        "b=x=y",
        "--delete",
        "c",
        "--append",
        "l=v",
        *BOOT,
    )
    assert code == 0 and "Updated configs of topic t." in out
    assert rpc.body == {
        "resources": [
            {
                "resource_type": "topic",
                "resource_name": "t",
                "ops": [
                    {"name": "a", "op": "SET", "value": "1"},
                    {"name": "b", "op": "SET", "value": "x=y"},
                    {"name": "l", "op": "APPEND", "value": "v"},
                    {"name": "c", "op": "DELETE"},
                ],
            }
        ],
        "validate_only": False,
    }


def test_configs_alter_usage_errors(capsys: pytest.CaptureFixture, rpc: FakeRpc) -> None:
    assert run(capsys, "configs", "alter", "--topic", "t", *BOOT)[0] == 2
    assert (
        run(capsys, "configs", "alter", "--topic", "t", "--set", "a=1", "--delete", "a", *BOOT)[0]
        == 2
    )
    assert run(capsys, "configs", "alter", "--topic", "t", "--delete", "a=1", *BOOT)[0] == 2
    assert rpc.calls == []


def test_configs_alter_item_error(capsys: pytest.CaptureFixture, rpc: FakeRpc) -> None:
    rpc.responses["IncrementalAlterConfigs"] = {
        "resources": [
            {
                "resource_type": "broker",
                "resource_name": "",
                "error_code": 40,
                "error_message": "unknown config x",
            }
        ]
    }
    code, _, err = run(capsys, "configs", "alter", "--broker-defaults", "--set", "x=1", *BOOT)
    assert code == 1
    assert "Error: INVALID_CONFIG: broker defaults: unknown config x" in err


# ---- cluster describe (the quorum commands: test_quorum_cli.py) ----------------------------------


def test_cluster_describe(capsys: pytest.CaptureFixture, rpc: FakeRpc) -> None:
    rpc.responses["DescribeCluster"] = {
        "offset": 7,
        "cluster_id": "cid",
        "controller_id": 1,
        "brokers": [
            {
                "broker_id": 102,
                "epoch": 9,
                "incarnation_id": "i",
                "rack": None,
                "fenced": True,
                "in_controlled_shutdown": False,
                "state": "fenced",
                "listeners": [
                    {
                        "name": "PLAINTEXT",
                        "host": "127.0.0.1",
                        "port": 9092,
                        "security_protocol": "PLAINTEXT",
                    }
                ],
            },
            {
                "broker_id": 101,
                "epoch": 8,
                "incarnation_id": "j",
                "rack": "r1",
                "fenced": False,
                "in_controlled_shutdown": False,
                "state": "unfenced",
                "listeners": [],
            },
        ],
    }
    code, out, _ = run(capsys, "cluster", "describe", *BOOT)
    assert code == 0
    lines = out.splitlines()
    assert "Cluster id:        cid" in lines and "Active controller: 1" in lines
    table = lines[lines.index("BROKER  EPOCH  RACK  STATE     LISTENERS") :]
    assert table[1].split() == ["101", "8", "r1", "unfenced", "-"]
    assert table[2].split() == ["102", "9", "-", "fenced", "PLAINTEXT://127.0.0.1:9092"]
    code, out, _ = run(capsys, "cluster", "describe", *BOOT, "--json")
    assert json.loads(out)["brokers"][0]["broker_id"] == 102


def test_cluster_describe_asks_the_active_controller_for_divergent_images(
    capsys: pytest.CaptureFixture, rpc: FakeRpc
) -> None:
    broker = {"broker_id": 101, "epoch": 8, "rack": None, "state": "fenced", "listeners": []}
    rpc.responses["DescribeCluster"] = {
        "offset": 7,
        "cluster_id": "cid",
        "controller_id": 1,
        "brokers": [{**broker, "image_mismatch": {"offset": 6, "checksum": "b", "fenced": True}}],
        "divergent_brokers": [101],
    }
    code, out, _ = run(capsys, "cluster", "describe", *BOOT)
    assert code == 0 and len(rpc.calls) == 1  # the active controller answered
    assert "Broker 101: metadata image differs from the controllers' at offset 6" in out
    rpc.responses["DescribeCluster"] = {
        "offset": 7,
        "cluster_id": "cid",
        "controller_id": 1,
        "brokers": [broker],
    }
    code, out, _ = run(capsys, "cluster", "describe", *BOOT)
    assert code == 0  # a standby answered: asked again, of the active controller only
    assert [c[2] for c in rpc.calls[1:]] == [{}, {"active_only": True}]


# ---- node commands -------------------------------------------------------------------------------------


def test_controller_and_broker_commands_run_the_node_mains(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, str]] = []
    # cmd_broker hides hypothesis from kio (sys.modules["hypothesis"] = None); undone after
    # the test, so later tests in this process can still import it.
    monkeypatch.setitem(sys.modules, "hypothesis", sys.modules.get("hypothesis"))
    for module, role in (("kraft.controller_server", "controller"), ("broker.node", "broker")):
        fake = types.ModuleType(module)
        fake.main = lambda path, role=role: seen.append((role, path)) or 3  # type: ignore[attr-defined]  # a stand-in module
        monkeypatch.setitem(sys.modules, module, fake)
    assert run(capsys, "controller", "--config", "c.properties")[0] == 3
    assert run(capsys, "broker", "--config", "b.properties")[0] == 3
    assert seen == [("controller", "c.properties"), ("broker", "b.properties")]
    assert run(capsys, "controller")[0] == 2


def test_kill_signal_names_are_case_insensitive() -> None:
    args = cli.build_parser().parse_args(
        ["cluster", "kill", "--dir", "d", "--node", "1", "--signal", "stop"]
    )
    assert args.signal == "STOP"


def test_delete_records_requires_topic_partition_and_offset(capsys: pytest.CaptureFixture) -> None:
    assert run(capsys, "topics", "delete-records", "--topic", "t", "--offset", "5", *BOOT)[0] == 2
    assert (
        run(
            capsys,
            "topics",
            "delete-records",
            "--topic",
            "t",
            "--partition",
            "x",
            "--offset",
            "5",
            *BOOT,
        )[0]
        == 2
    )
