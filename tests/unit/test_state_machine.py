"""The controller state machine, API by API: success paths, Kafka's errors, and "an error changes
nothing" (no batch, same image, same offset)."""

from __future__ import annotations

import uuid

import pytest

from kraft.controller import state_machine as sm_module
from kraft.controller.commands import Command, ControllerResult
from kraft.controller.settings import ControllerSettings
from kraft.controller.state_machine import QuorumStateMachine
from kraft.errors import ErrorCode
from kraft.metadata.delta import ReplayError
from kraft.metadata.image import MetadataImage
from kraft.metadata.replay import replay
from kraft.records import (
    LEADER_NONE,
    LEADER_UNCHANGED,
    RECOVERED,
    RECOVERING,
    ZERO_HASH,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    FeatureLevelRecord,
    LeaderChangeRecord,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnregisterBrokerRecord,
    batch_hash,
    decode_batch,
)

CLUSTER = "test-cluster"
E = ErrorCode


def listener(port: int) -> dict:
    return {
        "name": "PLAINTEXT",
        "host": "127.0.0.1",
        "port": port,
        "security_protocol": "PLAINTEXT",
    }


class Harness:
    """A state machine plus helpers that act like the controller node would."""

    def __init__(self, brokers: int = 0, racks: list[str] | None = None, **settings) -> None:
        self.sm = QuorumStateMachine(ControllerSettings(CLUSTER, **settings))
        self.n = 0
        self.forget_resume = False  # act like a controller that lost a stepped transition's rest
        self.resumed: list[bool] = []  # per write: was the previous step's rest handed on
        self._resume: tuple = ()  # (api, broker id, image position, rest) after a stepped write
        self.write("ActivateController", {"leader_id": 1, "term": 1})
        for i in range(brokers):
            self.add_broker(i, rack=racks[i] if racks else None)

    @property
    def image(self) -> MetadataImage:
        return self.sm.image

    def write(self, api: str, body: dict, request_id: str | None = None, seed: int | None = None):
        self.n += 1
        command = Command(
            api,
            body,
            request_id=f"req-{self.n}" if request_id is None else request_id,
            principal="User:alice",
            client_id="cli",
            timestamp_ms=1_000 + self.n,
            seed=self.n if seed is None else seed,
            leader_id=1,
        )
        image = self.sm.image
        key = (api, body.get("broker_id") if isinstance(body, dict) else None)
        at = None
        if self._resume and self._resume[:3] == (*key, (image.offset, image.last_hash)):
            at = None if self.forget_resume else self._resume[3]
        self.resumed.append(at is not None)
        batch, response, rest = self.sm.propose(command, term=1, resume=at)
        position = (self.sm.image.offset, self.sm.image.last_hash)
        self._resume = (*key, position, rest) if rest is not None else ()
        return batch, response

    def ok(self, api: str, body: dict, **kw):
        batch, response = self.write(api, body, **kw)
        assert response.get("error_code", 0) == 0, response
        for item in response.get("topics", []) if api == "CreateTopics" else []:
            assert item["error_code"] == 0, item
        return batch, response

    def fails(self, api: str, body: dict, **kw) -> dict:
        """Run a request expected to change nothing; return its response."""
        before, checksum = self.image, self.image.checksum()
        batch, response = self.write(api, body, **kw)
        assert batch is None, batch
        assert self.image is before and self.image.checksum() == checksum
        return response

    def add_broker(self, broker_id: int, rack: str | None = None, unfence: bool = True) -> int:
        _, r = self.ok(
            "BrokerRegistration",
            {
                "broker_id": broker_id,
                "cluster_id": CLUSTER,
                "incarnation_id": str(uuid.UUID(int=broker_id + 1)),
                "listeners": [listener(9092 + broker_id)],
                "rack": rack,
            },
        )
        if unfence:
            self.ok("UnfenceBroker", {"broker_id": broker_id, "broker_epoch": r["broker_epoch"]})
        return r["broker_epoch"]

    def epoch(self, broker_id: int) -> int:
        return self.image.brokers[broker_id].epoch

    def create(self, name: str, partitions: int = 1, rf: int = 1, **extra) -> dict:
        _, r = self.ok(
            "CreateTopics",
            {
                "topics": [
                    {"name": name, "num_partitions": partitions, "replication_factor": rf, **extra}
                ]
            },
        )
        assert r["topics"][0]["error_code"] == 0, r
        return r["topics"][0]

    def part(self, name: str, pid: int = 0):
        return self.image.topic(name).partitions[pid]

    def fence(self, broker_id: int):
        return self.ok(
            "FenceBroker",
            {
                "broker_id": broker_id,
                "broker_epoch": self.epoch(broker_id),
                "reason": "session-timeout",
            },
        )

    def unfence(self, broker_id: int):
        return self.ok(
            "UnfenceBroker", {"broker_id": broker_id, "broker_epoch": self.epoch(broker_id)}
        )


def only_topic(response: dict) -> dict:
    (topic,) = response["topics"]
    return topic


# ---- commands ---------------------------------------------------------------------------------


# ---- dispatch, provenance, malformed input ----------------------------------------------------


def test_activation_bootstraps_metadata_version_once():
    h = Harness()
    first = h.sm.image
    assert (
        first.features == {"metadata.version": 2} and first.controller_id == 1 and first.offset == 1
    )
    batch, _ = h.ok("ActivateController", {"leader_id": 2, "term": 2})
    assert [type(r) for r in batch.records] == [LeaderChangeRecord]
    assert batch.provenance.reason == "controller-activated"
    assert h.image.controller_id == 2


def test_first_batch_layout_and_provenance():
    sm = QuorumStateMachine(ControllerSettings(CLUSTER, metadata_version=7))
    cmd = Command(
        "ActivateController", {"leader_id": 3, "term": 4}, "req-a", "User:x", "node", 99, 5, 3
    )
    batch, response, _ = sm.propose(cmd, term=4)
    assert response == {"error_code": 0, "error_message": ""}
    assert batch.base_offset == 0 and batch.prev_hash == ZERO_HASH and batch.fmt == 2
    assert batch.raft_index == batch.raft_position == 0  # Raft places it after it is built
    assert batch.term == 4 and batch.timestamp_ms == 99
    assert batch.records == (FeatureLevelRecord("metadata.version", 7), LeaderChangeRecord(3, 4))
    p = batch.provenance
    assert (p.principal, p.client_id, p.request_id, p.api, p.reason) == (
        "User:x",
        "node",
        "req-a",
        "ActivateController",
        "bootstrap",
    )
    assert sm.image.last_hash == batch_hash(batch.encode()) == batch_hash(sm.last_encoded)
    assert decode_batch(batch.encode()) == batch


@pytest.mark.parametrize(
    "api, body",
    [
        ("NoSuchApi", {}),
        ("DescribeTopics", {}),  # a read is not a replicated write
        (
            "BrokerRegistration",
            {"broker_id": True, "cluster_id": CLUSTER, "incarnation_id": "x", "listeners": []},
        ),
        ("ElectLeaders", {"election_type": "sideways"}),
    ],
)
def test_unknown_api_or_malformed_body_is_invalid_request(api, body):
    """(Missing fields and wrong types are refused at the dispatch: tests/unit/test_rpc_bodies.py.)"""
    h = Harness(brokers=1)
    r = h.fails(api, body)
    assert r["error_code"] == E.INVALID_REQUEST and r["error_message"]


def test_malformed_nested_items_are_per_item_errors():
    h = Harness(brokers=1)
    r = h.fails(
        "CreateTopics",
        {"topics": [5, {"name": "t", "num_partitions": "3"}, {"name": "u", "configs": [1]}]},
    )
    assert [t["error_code"] for t in r["topics"]] == [E.INVALID_REQUEST] * 3


def test_batch_time_never_goes_backwards():
    h = Harness(brokers=1)
    cmd = Command("NoOp", {}, "late", timestamp_ms=5, seed=1)
    batch, _, _ = h.sm.propose(cmd, 1)
    assert batch.timestamp_ms == h.image.timestamp_ms >= 1_000
    assert batch.records == (NoOpRecord(),) and batch.provenance.reason == "no-op"


def test_a_record_that_fails_to_replay_is_fatal(monkeypatch):
    h = Harness(brokers=1)
    bad = PartitionChangeRecord(0, str(uuid.uuid4()), (0,), -2, None, None, None, -1, None)
    monkeypatch.setitem(
        sm_module.WRITES, "NoOp", lambda image, cmd, s: ControllerResult([bad], {}, "x")
    )
    before = h.image
    with pytest.raises(ReplayError):
        h.write("NoOp", {})
    assert h.image is before


# ---- CreateTopics -----------------------------------------------------------------------------


def test_create_topic_writes_one_atomic_batch():
    h = Harness(brokers=3)
    batch, r = h.ok(
        "CreateTopics",
        {
            "topics": [
                {
                    "name": "orders",
                    "num_partitions": 3,
                    "replication_factor": 2,
                    "configs": {"retention.ms": "1000", "cleanup.policy": "compact"},
                }
            ]
        },
    )
    t = only_topic(r)
    assert (t["name"], t["error_code"], t["num_partitions"], t["replication_factor"]) == (
        "orders",
        0,
        3,
        2,
    )
    assert uuid.UUID(t["topic_id"]).version == 4
    assert [type(x) for x in batch.records] == [TopicRecord, ConfigRecord, ConfigRecord] + [
        PartitionRecord
    ] * 3
    assert [x.name for x in batch.records[1:3]] == ["cleanup.policy", "retention.ms"]
    assert batch.provenance.reason == "user-request" and batch.provenance.api == "CreateTopics"
    for pid in range(3):
        p = h.part("orders", pid)
        assert len(set(p.replicas)) == 2 and p.isr == p.replicas and p.leader == p.replicas[0]
        assert (p.leader_epoch, p.partition_epoch, p.leader_recovery_state) == (0, 0, RECOVERED)
    assert h.image.config(2, "orders") == {"cleanup.policy": "compact", "retention.ms": "1000"}


def test_topic_id_derives_from_seed_and_name():
    a, b = Harness(brokers=1), Harness(brokers=1)
    ra = a.ok("CreateTopics", {"topics": [{"name": "t"}]}, seed=42)[1]
    rb = b.ok("CreateTopics", {"topics": [{"name": "t"}]}, seed=42)[1]
    rc = b.ok("CreateTopics", {"topics": [{"name": "u"}]}, seed=42)[1]
    assert only_topic(ra)["topic_id"] == only_topic(rb)["topic_id"] != only_topic(rc)["topic_id"]


def test_defaults_come_from_settings():
    h = Harness(brokers=2, num_partitions=4, default_replication_factor=2)
    t = only_topic(h.ok("CreateTopics", {"topics": [{"name": "t", "num_partitions": -1}]})[1])
    assert (t["num_partitions"], t["replication_factor"]) == (4, 2)


def test_failed_topics_add_nothing_while_others_succeed():
    h = Harness(brokers=1)
    h.create("exists")
    batch, r = h.write(
        "CreateTopics",
        {
            "topics": [
                {"name": "good"},
                {"name": "exists"},
                {"name": "bad name"},
                {"name": "dup"},
                {"name": "dup"},
                {"name": "rf", "replication_factor": 2},
                {"name": "zero", "num_partitions": 0},
                {"name": "zerorf", "replication_factor": 0},
                {"name": "cfg", "configs": {"retention.ms": "x"}},
                {"name": "cfgkey", "configs": {"nope": "1"}},
            ]
        },
    )
    codes = {t["name"]: t["error_code"] for t in r["topics"] if t["name"] != "dup"}
    assert codes == {
        "good": 0,
        "exists": E.TOPIC_ALREADY_EXISTS,
        "bad name": E.INVALID_TOPIC_EXCEPTION,
        "rf": E.INVALID_REPLICATION_FACTOR,
        "zero": E.INVALID_PARTITIONS,
        "zerorf": E.INVALID_REPLICATION_FACTOR,
        "cfg": E.INVALID_CONFIG,
        "cfgkey": E.INVALID_CONFIG,
    }
    assert [t["error_code"] for t in r["topics"] if t["name"] == "dup"] == [E.INVALID_REQUEST] * 2
    assert {x.name for x in batch.records if isinstance(x, TopicRecord)} == {"good"}
    assert sorted(h.image.topics_by_name) == ["exists", "good"]
    assert "retention.ms" in next(t for t in r["topics"] if t["name"] == "cfg")["error_message"]


def test_all_failed_creates_change_nothing():
    h = Harness(brokers=1)
    h.create("a")
    r = h.fails("CreateTopics", {"topics": [{"name": "a"}, {"name": "..", "num_partitions": 1}]})
    assert [t["error_code"] for t in r["topics"]] == [
        E.TOPIC_ALREADY_EXISTS,
        E.INVALID_TOPIC_EXCEPTION,
    ]


def test_collisions_with_existing_and_within_one_request():
    h = Harness(brokers=1)
    h.create("metrics.cpu")
    r = h.fails("CreateTopics", {"topics": [{"name": "metrics_cpu"}]})
    assert (
        only_topic(r)["error_code"] == E.INVALID_TOPIC_EXCEPTION
        and "metrics.cpu" in only_topic(r)["error_message"]
    )
    _, r = h.write("CreateTopics", {"topics": [{"name": "a.b"}, {"name": "a_b"}]})
    assert [t["error_code"] for t in r["topics"]] == [0, E.INVALID_TOPIC_EXCEPTION]


def test_validate_only_writes_nothing():
    h = Harness(brokers=1)
    r = h.fails(
        "CreateTopics", {"topics": [{"name": "t", "num_partitions": 2}], "validate_only": True}
    )
    assert only_topic(r)["error_code"] == 0 and only_topic(r)["num_partitions"] == 2
    assert "t" not in h.image.topics_by_name


def test_no_unfenced_broker_means_no_topic():
    h = Harness()
    h.add_broker(0, unfence=False)
    r = h.fails("CreateTopics", {"topics": [{"name": "t"}]})
    assert only_topic(r)["error_code"] == E.INVALID_REPLICATION_FACTOR


def test_rack_aware_placement_spreads_each_partition_over_racks():
    h = Harness(brokers=6, racks=["a", "a", "b", "b", "c", "c"])
    h.create("t", partitions=12, rf=3)
    racks = {b: h.image.brokers[b].rack for b in h.image.brokers}
    leaders = set()
    for pid in range(12):
        p = h.part("t", pid)
        assert sorted(racks[b] for b in p.replicas) == ["a", "b", "c"]
        leaders.add(p.leader)
    assert len(leaders) >= 3  # leadership is spread, not piled on one broker


def test_placement_avoids_fenced_leaders_and_controlled_shutdown():
    h = Harness(brokers=3)
    h.fence(0)
    h.ok("BeginControlledShutdown", {"broker_id": 1, "broker_epoch": h.epoch(1)})
    h.create("t", partitions=6, rf=1)
    assert all(h.part("t", pid).replicas == (2,) for pid in range(6))


def test_manual_assignment():
    h = Harness(brokers=3)
    h.fence(2)
    _, r = h.ok(
        "CreateTopics", {"topics": [{"name": "m", "assignments": {0: [2, 1], "1": [0, 2]}}]}
    )
    t = only_topic(r)
    assert (t["num_partitions"], t["replication_factor"]) == (2, 2)
    p0, p1 = h.part("m", 0), h.part("m", 1)
    assert (p0.replicas, p0.isr, p0.leader) == ((2, 1), (1,), 1)
    assert (p1.replicas, p1.isr, p1.leader) == ((0, 2), (0,), 0)


@pytest.mark.parametrize(
    "assignments, code",
    [
        ({0: [0], 2: [1]}, E.INVALID_REPLICA_ASSIGNMENT),  # gap
        ({1: [0]}, E.INVALID_REPLICA_ASSIGNMENT),  # does not start at 0
        ({0: [0, 0]}, E.INVALID_REPLICA_ASSIGNMENT),  # duplicate broker
        ({0: [0, 9]}, E.INVALID_REPLICA_ASSIGNMENT),  # unregistered broker
        ({0: [0, 1], 1: [1]}, E.INVALID_REPLICA_ASSIGNMENT),  # different RF
        ({0: []}, E.INVALID_REPLICA_ASSIGNMENT),  # empty
        ({0: [2]}, E.INVALID_REPLICA_ASSIGNMENT),  # only a fenced broker
        ({"x": [0]}, E.INVALID_REPLICA_ASSIGNMENT),
        ([0, 1], E.INVALID_REQUEST),
    ],
)
def test_bad_manual_assignments(assignments, code):
    h = Harness(brokers=3)
    h.fence(2)
    r = h.fails("CreateTopics", {"topics": [{"name": "m", "assignments": assignments}]})
    assert only_topic(r)["error_code"] == code


def test_manual_assignment_with_counts_is_invalid_request():
    h = Harness(brokers=2)
    r = h.fails(
        "CreateTopics", {"topics": [{"name": "m", "num_partitions": 1, "assignments": {0: [0]}}]}
    )
    assert only_topic(r)["error_code"] == E.INVALID_REQUEST


def test_request_over_the_batch_limit_fails_atomically():
    h = Harness(brokers=1, max_records_per_batch=10)
    r = h.fails(
        "CreateTopics",
        {
            "topics": [
                {"name": "a", "num_partitions": 4},
                {"name": "b", "num_partitions": 5},
                {"name": "bad name"},
            ]
        },
    )
    assert [t["error_code"] for t in r["topics"]] == [
        E.POLICY_VIOLATION,
        E.POLICY_VIOLATION,
        E.INVALID_TOPIC_EXCEPTION,
    ]
    r = h.fails("CreateTopics", {"topics": [{"name": "huge", "num_partitions": 10}]})
    assert only_topic(r)["error_code"] == E.POLICY_VIOLATION
    h.create("fits", partitions=9)


def test_kafka_limit_of_10000_records_per_request():
    h = Harness(brokers=1)
    r = h.fails("CreateTopics", {"topics": [{"name": "big", "num_partitions": 10_000}]})
    assert (
        only_topic(r)["error_code"] == E.POLICY_VIOLATION
        and "10000" in only_topic(r)["error_message"]
    )


# ---- CreatePartitions -------------------------------------------------------------------------


def test_create_partitions_keeps_rf_and_continues_ids():
    h = Harness(brokers=3)
    h.create("t", partitions=2, rf=2)
    batch, r = h.ok("CreatePartitions", {"topics": [{"name": "t", "count": 5}]})
    assert only_topic(r) == {"name": "t", "error_code": 0, "error_message": ""}
    assert [x.partition_id for x in batch.records] == [2, 3, 4]
    assert all(len(h.part("t", p).replicas) == 2 for p in range(5))


def test_create_partitions_manual_and_errors():
    h = Harness(brokers=3)
    h.create("t", partitions=2, rf=2)
    h.ok("CreatePartitions", {"topics": [{"name": "t", "count": 3, "assignments": [[2, 0]]}]})
    assert h.part("t", 2).replicas == (2, 0)
    cases = [
        ({"name": "t", "count": 3}, E.INVALID_PARTITIONS),
        ({"name": "t", "count": 1}, E.INVALID_PARTITIONS),
        ({"name": "nope", "count": 4}, E.UNKNOWN_TOPIC_OR_PARTITION),
        ({"name": "t", "count": 5, "assignments": [[0, 1]]}, E.INVALID_REPLICA_ASSIGNMENT),
        ({"name": "t", "count": 4, "assignments": [[0]]}, E.INVALID_REPLICA_ASSIGNMENT),
        ({"name": "t", "count": 4, "assignments": [[0, 7]]}, E.INVALID_REPLICA_ASSIGNMENT),
        ({"name": "t", "count": "4"}, E.INVALID_REQUEST),
    ]
    for item, code in cases:
        assert only_topic(h.fails("CreatePartitions", {"topics": [item]}))["error_code"] == code, (
            item
        )
    r = h.fails("CreatePartitions", {"topics": [{"name": "t", "count": 9}], "validate_only": True})
    assert only_topic(r)["error_code"] == 0


# ---- DeleteTopics -----------------------------------------------------------------------------


def test_delete_topics():
    h = Harness(brokers=1)
    tid = h.create("t", configs={"retention.ms": "5"})["topic_id"]
    h.create("u")
    batch, r = h.ok("DeleteTopics", {"names": ["t", "missing"]})
    assert batch.records == (RemoveTopicRecord(tid),)
    assert [(x["name"], x["topic_id"], x["error_code"]) for x in r["topics"]] == [
        ("t", tid, 0),
        ("missing", "", E.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    assert "t" not in h.image.topics_by_name and h.image.config(2, "t") == {}
    r = h.fails("DeleteTopics", {"names": ["u", "u"]})
    assert [x["error_code"] for x in r["topics"]] == [E.INVALID_REQUEST] * 2
    new_id = h.create("t")["topic_id"]
    assert new_id != tid and h.image.config(2, "t") == {}


# ---- IncrementalAlterConfigs / DescribeConfigs --------------------------------------------------


def alter(h, ops, rtype="topic", name="t", **kw):
    return h.write(
        "IncrementalAlterConfigs",
        {"resources": [{"resource_type": rtype, "resource_name": name, "ops": ops}], **kw},
    )


def test_alter_configs_set_delete_append_subtract():
    h = Harness(brokers=1)
    h.create("t")
    batch, r = alter(
        h,
        [
            {"name": "retention.ms", "op": "SET", "value": "100"},
            {"name": "cleanup.policy", "op": "APPEND", "value": "compact"},
        ],
    )
    assert r["resources"][0]["error_code"] == 0
    assert h.image.config(2, "t") == {"retention.ms": "100", "cleanup.policy": "delete,compact"}
    alter(
        h,
        [
            {"name": "cleanup.policy", "op": "SUBTRACT", "value": "delete"},
            {"name": "retention.ms", "op": "DELETE"},
        ],
    )
    assert h.image.config(2, "t") == {"cleanup.policy": "compact"}
    batch, r = alter(h, [{"name": "cleanup.policy", "op": "SET", "value": "compact"}])  # no change
    assert batch is None and r["resources"][0]["error_code"] == 0


@pytest.mark.parametrize(
    "ops, code",
    [
        ([{"name": "nope", "op": "SET", "value": "1"}], E.INVALID_CONFIG),
        ([{"name": "retention.ms", "op": "SET", "value": "-7"}], E.INVALID_CONFIG),
        ([{"name": "retention.ms", "op": "APPEND", "value": "1"}], E.INVALID_CONFIG),
        ([{"name": "retention.ms", "op": "SET"}], E.INVALID_CONFIG),
        (
            [{"name": "cleanup.policy", "op": "SUBTRACT", "value": "delete"}],
            E.INVALID_CONFIG,
        ),  # would be empty
        ([{"name": "retention.ms", "op": "RESET", "value": "1"}], E.INVALID_REQUEST),
        (
            [
                {"name": "retention.ms", "op": "SET", "value": "1"},
                {"name": "retention.ms", "op": "DELETE"},
            ],
            E.INVALID_REQUEST,
        ),
    ],
)
def test_bad_config_ops_change_nothing(ops, code):
    h = Harness(brokers=1)
    h.create("t")
    r = h.fails(
        "IncrementalAlterConfigs",
        {
            "resources": [
                {
                    "resource_type": "topic",
                    "resource_name": "t",
                    "ops": [{"name": "segment.ms", "op": "SET", "value": "5"}, *ops],
                }
            ]
        },
    )
    assert r["resources"][0]["error_code"] == code


def test_alter_config_resources():
    h = Harness(brokers=1)
    assert (
        h.fails(
            "IncrementalAlterConfigs",
            {"resources": [{"resource_type": "topic", "resource_name": "missing", "ops": []}]},
        )["resources"][0]["error_code"]
        == E.UNKNOWN_TOPIC_OR_PARTITION
    )
    for rname, code in (
        ("7", E.BROKER_ID_NOT_REGISTERED),
        ("x", E.INVALID_REQUEST),
        ("01", E.INVALID_REQUEST),
    ):
        r = h.fails(
            "IncrementalAlterConfigs",
            {
                "resources": [
                    {
                        "resource_type": "broker",
                        "resource_name": rname,
                        "ops": [{"name": "num.io.threads", "op": "SET", "value": "2"}],
                    }
                ]
            },
        )
        assert r["resources"][0]["error_code"] == code
    r = h.fails(
        "IncrementalAlterConfigs",
        {"resources": [{"resource_type": "group", "resource_name": "g", "ops": []}]},
    )
    assert r["resources"][0]["error_code"] == E.INVALID_REQUEST
    batch, r = h.write(
        "IncrementalAlterConfigs",
        {
            "resources": [
                {
                    "resource_type": "broker",
                    "resource_name": "",
                    "ops": [{"name": "log.retention.ms", "op": "SET", "value": "9"}],
                },
                {
                    "resource_type": "broker",
                    "resource_name": "0",
                    "ops": [{"name": "num.io.threads", "op": "SET", "value": "2"}],
                },
            ]
        },
    )
    assert [x["error_code"] for x in r["resources"]] == [0, 0] and len(batch.records) == 2
    assert h.image.config(4, "") == {"log.retention.ms": "9"} and h.image.config(4, "0") == {
        "num.io.threads": "2"
    }
    r = h.fails(
        "IncrementalAlterConfigs",
        {
            "resources": [
                {
                    "resource_type": "broker",
                    "resource_name": "",
                    "ops": [{"name": "log.retention.ms", "op": "SET", "value": "1"}],
                }
            ],
            "validate_only": True,
        },
    )
    assert r["resources"][0]["error_code"] == 0


def test_describe_configs_shows_dynamic_and_defaults():
    h = Harness(brokers=1)
    h.create("t", configs={"retention.ms": "100"})
    alter(h, [{"name": "log.segment.bytes", "op": "SET", "value": "2048"}], rtype="broker", name="")
    r = h.sm.read(
        "DescribeConfigs",
        {
            "resources": [
                {"resource_type": "topic", "resource_name": "t"},
                {"resource_type": "topic", "resource_name": "nope"},
                {"resource_type": "broker", "resource_name": "0"},
            ]
        },
    )
    assert r["offset"] == h.image.offset
    topic, missing, broker = r["resources"]
    by_name = {c["name"]: c for c in topic["configs"]}
    assert (by_name["retention.ms"]["value"], by_name["retention.ms"]["source"]) == (
        "100",
        "dynamic",
    )
    assert (by_name["segment.bytes"]["value"], by_name["segment.bytes"]["source"]) == (
        "2048",
        "default",
    )
    assert (by_name["cleanup.policy"]["value"], by_name["cleanup.policy"]["source"]) == (
        "delete",
        "default",
    )
    assert missing["error_code"] == E.UNKNOWN_TOPIC_OR_PARTITION
    assert {c["name"]: c["value"] for c in broker["configs"]}["log.segment.bytes"] == "2048"


# ---- brokers ------------------------------------------------------------------------------------


def register(h, broker_id=0, incarnation=1, cluster=CLUSTER, **extra):
    return h.write(
        "BrokerRegistration",
        {
            "broker_id": broker_id,
            "cluster_id": cluster,
            "incarnation_id": str(uuid.UUID(int=incarnation)),
            "listeners": [listener(9092)],
            **extra,
        },
    )


def test_registration_epoch_is_the_record_offset_and_broker_starts_fenced():
    h = Harness()
    batch, r = register(h, rack="r1")
    assert r == {"error_code": 0, "error_message": "", "broker_epoch": batch.base_offset}
    (record,) = batch.records
    assert isinstance(record, RegisterBrokerRecord) and record.fenced and record.rack == "r1"
    assert batch.provenance.reason == "broker-registration"


def test_registration_errors():
    h = Harness(brokers=1)  # broker 0, incarnation 1, unfenced
    assert (
        h.fails(
            "BrokerRegistration",
            {
                "broker_id": 5,
                "cluster_id": "other",
                "incarnation_id": str(uuid.uuid4()),
                "listeners": [],
            },
        )["error_code"]
        == E.INCONSISTENT_CLUSTER_ID
    )
    r = register(h, incarnation=2)
    assert (
        r[0] is None
        and r[1]["error_code"] == E.DUPLICATE_BROKER_REGISTRATION
        and r[1]["broker_epoch"] == -1
    )
    assert (
        register(h, broker_id=3, incarnation=9, features=[])[1]["error_code"]
        == E.UNSUPPORTED_VERSION
    )
    ok_features = [{"name": "metadata.version", "min_version": 1, "max_version": 3}]
    assert register(h, broker_id=3, incarnation=9, features=ok_features)[1]["error_code"] == 0
    for bad in (
        {"incarnation_id": "not-a-uuid"},
        {"listeners": [{"host": "h"}]},
        {"broker_id": -1},
        {"broker_id": 1 << 31},
    ):
        body = {
            "broker_id": 4,
            "cluster_id": CLUSTER,
            "incarnation_id": str(uuid.uuid4()),
            "listeners": [listener(1)],
            **bad,
        }
        assert h.fails("BrokerRegistration", body)["error_code"] == E.INVALID_REQUEST


def test_reregistration_rules():
    h = Harness(brokers=1)
    epoch = h.epoch(0)
    _, r = register(h, incarnation=1)  # same incarnation: amended, epoch and state kept
    assert r["broker_epoch"] == epoch and not h.image.brokers[0].fenced
    assert register(h, incarnation=2)[1]["error_code"] == E.DUPLICATE_BROKER_REGISTRATION
    h.fence(0)  # (a fenced one whose session is still live is refused by the node itself)
    batch, r = register(h, incarnation=2)  # the old incarnation is fenced: the new one takes over
    assert r["broker_epoch"] == batch.base_offset > epoch and h.image.brokers[0].fenced


def test_a_new_incarnation_with_its_disks_proof_keeps_the_partitions():
    """``previous_broker_epoch`` equal to the unfenced registration's epoch (the broker's log dirs
    were last registered with it) replaces the registration, fenced, without moving a
    leadership or an ISR place; anything else is refused while the old one is unfenced."""
    h = Harness(brokers=2)
    h.ok("CreateTopics", {"topics": [{"name": "t", "assignments": {0: [0, 1], 1: [1, 0]}}]})
    before = {pid: p for pid, p in h.image.topic("t").partitions.items()}
    epoch = h.epoch(0)
    for proof in (-1, epoch - 1, epoch + 1, str(epoch), None, True):
        r = register(h, incarnation=7, previous_broker_epoch=proof)[1]
        assert r["error_code"] == E.DUPLICATE_BROKER_REGISTRATION, proof
    batch, r = register(h, incarnation=7, previous_broker_epoch=epoch)
    assert r["error_code"] == 0 and r["broker_epoch"] == batch.base_offset > epoch
    (record,) = batch.records  # the registration alone: no partition change
    assert isinstance(record, RegisterBrokerRecord) and record.fenced
    reg = h.image.brokers[0]
    assert (
        reg.fenced
        and reg.epoch == r["broker_epoch"]
        and reg.incarnation_id == record.incarnation_id
    )
    assert dict(h.image.topic("t").partitions) == before  # still leads 0, still in both ISRs
    batch, r = h.unfence(0)  # caught up: unfenced; it leads what it led, nothing to elect
    assert [type(x).__name__ for x in batch.records] == ["BrokerRegistrationChangeRecord"]
    assert h.part("t", 0).leader == 0 and h.part("t", 0).leader_epoch == before[0].leader_epoch
    # the proof names the registration it replaces, not any older one
    assert register(h, incarnation=8, previous_broker_epoch=epoch)[1]["error_code"] == (
        E.DUPLICATE_BROKER_REGISTRATION
    )


def test_fence_moves_leadership_and_shrinks_isr():
    h = Harness(brokers=3)
    h.ok(
        "CreateTopics",
        {
            "topics": [
                {"name": "t", "assignments": {0: [0, 1, 2], 1: [1, 0, 2]}},
                {"name": "solo", "assignments": {0: [0]}},
            ]
        },
    )
    batch, r = h.fence(0)
    assert (
        r == {"error_code": 0, "error_message": ""} and batch.provenance.reason == "session-timeout"
    )
    assert (
        isinstance(batch.records[-1], BrokerRegistrationChangeRecord)
        and batch.records[-1].fenced == 1
    )
    p0, p1, p2 = h.part("t", 0), h.part("t", 1), h.part("solo", 0)
    assert (p0.leader, p0.isr, p0.leader_epoch, p0.partition_epoch) == (1, (1, 2), 1, 1)
    assert (p1.leader, p1.isr, p1.leader_epoch, p1.partition_epoch) == (1, (1, 2), 0, 1)
    assert (p2.leader, p2.isr) == (-1, (0,))  # the last ISR member stays
    assert h.image.brokers[0].fenced
    # already fenced: nothing to write; stale epoch and unknown broker are errors
    assert (
        h.fails("FenceBroker", {"broker_id": 0, "broker_epoch": h.epoch(0), "reason": "x"})[
            "error_code"
        ]
        == 0
    )
    assert (
        h.fails("FenceBroker", {"broker_id": 1, "broker_epoch": 999, "reason": "x"})["error_code"]
        == E.STALE_BROKER_EPOCH
    )
    assert (
        h.fails("FenceBroker", {"broker_id": 9, "broker_epoch": 1, "reason": "x"})["error_code"]
        == E.BROKER_ID_NOT_REGISTERED
    )


def test_unfence_gives_leaderless_partitions_a_leader():
    h = Harness(brokers=2)
    h.ok(
        "CreateTopics",
        {
            "topics": [
                {"name": "t", "assignments": {0: [0, 1]}},
                {"name": "u", "assignments": {0: [1]}},
            ]
        },
    )
    h.fence(1)
    h.fence(0)
    assert h.part("t", 0).leader == -1 and h.part("t", 0).isr == (0,)
    batch, _ = h.unfence(0)
    assert batch.provenance.reason == "broker-unfenced"
    assert (
        isinstance(batch.records[0], BrokerRegistrationChangeRecord)
        and batch.records[0].fenced == -1
    )
    p = h.part("t", 0)
    assert (p.leader, p.leader_epoch) == (0, 2)
    assert h.part("u", 0).leader == -1  # broker 1 is still fenced
    assert (
        h.fails("UnfenceBroker", {"broker_id": 0, "broker_epoch": h.epoch(0)})["error_code"] == 0
    )  # already
    assert (
        h.fails("UnfenceBroker", {"broker_id": 1, "broker_epoch": 3})["error_code"]
        == E.STALE_BROKER_EPOCH
    )


def test_unclean_topic_elects_out_of_sync_replica_when_last_isr_member_fences():
    h = Harness(brokers=2)
    h.ok(
        "CreateTopics",
        {
            "topics": [
                {
                    "name": "t",
                    "assignments": {0: [0, 1]},
                    "configs": {"unclean.leader.election.enable": "true"},
                }
            ]
        },
    )
    h.fence(1)
    h.unfence(1)  # back, but not in the ISR
    assert h.part("t").isr == (0,)
    batch, _ = h.fence(0)
    p = h.part("t")
    assert (p.leader, p.isr, p.leader_recovery_state) == (1, (1,), RECOVERING)
    assert batch.records[0].election == "unclean"


def test_controlled_shutdown():
    h = Harness(brokers=2)
    h.ok("CreateTopics", {"topics": [{"name": "t", "assignments": {0: [0, 1]}}]})
    batch, _ = h.ok("BeginControlledShutdown", {"broker_id": 0, "broker_epoch": h.epoch(0)})
    assert batch.provenance.reason == "controlled-shutdown"
    first = batch.records[0]
    assert (
        isinstance(first, BrokerRegistrationChangeRecord)
        and first.in_controlled_shutdown == 1
        and first.fenced == 0
    )
    assert (h.part("t").leader, h.part("t").isr) == (1, (1,))
    assert h.image.brokers[0].in_controlled_shutdown and not h.image.brokers[0].fenced
    assert (
        h.fails("BeginControlledShutdown", {"broker_id": 0, "broker_epoch": h.epoch(0)})[
            "error_code"
        ]
        == 0
    )
    assert (
        h.fails("UnfenceBroker", {"broker_id": 0, "broker_epoch": h.epoch(0)})["error_code"]
        == E.INVALID_REQUEST
    )
    assert (
        h.fails("BeginControlledShutdown", {"broker_id": 1, "broker_epoch": 0})["error_code"]
        == E.STALE_BROKER_EPOCH
    )


def test_unregister_broker():
    h = Harness(brokers=2)
    h.ok("CreateTopics", {"topics": [{"name": "t", "assignments": {0: [0, 1]}}]})
    batch, _ = h.ok("UnregisterBroker", {"broker_id": 0})
    assert isinstance(batch.records[-1], UnregisterBrokerRecord)
    assert 0 not in h.image.brokers and h.part("t").leader == 1
    assert h.fails("UnregisterBroker", {"broker_id": 0})["error_code"] == E.BROKER_ID_NOT_REGISTERED


def test_allocate_producer_ids_in_blocks():
    h = Harness(brokers=1)
    _, a = h.ok("AllocateProducerIds", {"broker_id": 0, "broker_epoch": h.epoch(0)})
    batch, b = h.ok("AllocateProducerIds", {"broker_id": 0, "broker_epoch": h.epoch(0)})
    assert (a["producer_id_start"], a["producer_id_len"], b["producer_id_start"]) == (0, 1000, 1000)
    assert batch.records == (ProducerIdsRecord(0, h.epoch(0), 2000),)
    assert (
        h.fails("AllocateProducerIds", {"broker_id": 0, "broker_epoch": 1})["error_code"]
        == E.STALE_BROKER_EPOCH
    )
    assert (
        h.fails("AllocateProducerIds", {"broker_id": 5, "broker_epoch": 1})["error_code"]
        == E.STALE_BROKER_EPOCH
    )


# ---- AlterPartition ---------------------------------------------------------------------------


def alter_isr(
    h, isr, broker=0, leader_epoch=None, partition_epoch=None, topic="t", pid=0, epoch=None, **extra
):
    p = h.part(topic, pid) if topic in h.image.topics_by_name else None
    item = {
        "partition": pid,
        "leader_epoch": p.leader_epoch if leader_epoch is None else leader_epoch,
        "partition_epoch": p.partition_epoch if partition_epoch is None else partition_epoch,
        "isr": isr,
        **extra,
    }
    tid = h.image.topics_by_name.get(topic, "no-such-id")
    return h.write(
        "AlterPartition",
        {
            "broker_id": broker,
            "broker_epoch": h.epoch(broker) if epoch is None else epoch,
            "topics": [{"topic_id": tid, "partitions": [item]}],
        },
    )


def test_alter_partition_shrink_and_expand():
    h = Harness(brokers=3)
    h.ok("CreateTopics", {"topics": [{"name": "t", "assignments": {0: [0, 1, 2]}}]})
    batch, r = alter_isr(h, [0, 2])
    assert batch.provenance.reason == "isr-shrink"
    (part,) = r["topics"][0]["partitions"]
    assert part == {
        "partition": 0,
        "error_code": 0,
        "error_message": "",
        "leader": 0,
        "leader_epoch": 0,
        "partition_epoch": 1,
        "isr": [0, 2],
        "leader_recovery_state": RECOVERED,
    }
    batch, r = alter_isr(h, [0, 1, 2], reason="caught-up")
    assert batch.provenance.reason == "caught-up" and h.part("t").isr == (0, 1, 2)
    batch, r = alter_isr(h, [0, 1, 2])  # no change: nothing written, current state returned
    assert batch is None and r["topics"][0]["partitions"][0]["partition_epoch"] == 2


def test_alter_partition_checks_in_kafka_order():
    h = Harness(brokers=3)
    h.ok("CreateTopics", {"topics": [{"name": "t", "assignments": {0: [0, 1, 2]}}]})
    alter_isr(h, [0, 1])  # partition epoch 1
    h.fence(2)
    codes = {
        "stale broker epoch": (alter_isr, dict(isr=[0], epoch=1), E.STALE_BROKER_EPOCH),
        "unknown topic": (
            alter_isr,
            dict(isr=[0], topic="zz", leader_epoch=0, partition_epoch=0),
            E.UNKNOWN_TOPIC_ID,
        ),
        "unknown partition": (
            alter_isr,
            dict(isr=[0], pid=5, leader_epoch=0, partition_epoch=0, topic="t"),
            None,
        ),
        "newer leader epoch": (alter_isr, dict(isr=[0], leader_epoch=3), E.NOT_CONTROLLER),
        "newer partition epoch": (alter_isr, dict(isr=[0], partition_epoch=7), E.NOT_CONTROLLER),
        "not the leader": (alter_isr, dict(isr=[1], broker=1), E.INVALID_REQUEST),
        "older partition epoch": (
            alter_isr,
            dict(isr=[0], partition_epoch=0),
            E.INVALID_UPDATE_VERSION,
        ),
        "not a replica": (alter_isr, dict(isr=[0, 7]), E.INVALID_REQUEST),
        "leader missing": (alter_isr, dict(isr=[1]), E.INVALID_REQUEST),
        "fenced member": (alter_isr, dict(isr=[0, 2]), E.INELIGIBLE_REPLICA),
        "back to recovering": (
            alter_isr,
            dict(isr=[0], leader_recovery_state=RECOVERING),
            E.INVALID_REQUEST,
        ),
    }
    for what, (fn, kw, code) in codes.items():
        before = h.image
        if what == "unknown partition":
            p = h.part("t")
            batch, r = h.write(
                "AlterPartition",
                {
                    "broker_id": 0,
                    "broker_epoch": h.epoch(0),
                    "topics": [
                        {
                            "topic_id": h.image.topics_by_name["t"],
                            "partitions": [
                                {
                                    "partition": 5,
                                    "leader_epoch": p.leader_epoch,
                                    "partition_epoch": 0,
                                    "isr": [0],
                                }
                            ],
                        }
                    ],
                },
            )
            code = E.UNKNOWN_TOPIC_OR_PARTITION
        else:
            batch, r = fn(h, **kw)
        assert batch is None and h.image is before, what
        got = r["error_code"] or r["topics"][0]["partitions"][0]["error_code"]
        assert got == code, (what, r)
    # a fenced leader epoch: the leader moved on
    old_epoch = h.part("t").leader_epoch
    h.fence(0)
    h.unfence(0)
    h.ok(
        "ElectLeaders",
        {"election_type": "preferred", "partitions": [{"topic": "t", "partition": 0}]},
    )
    batch, r = alter_isr(h, [0, 1], leader_epoch=old_epoch)
    assert batch is None and r["topics"][0]["partitions"][0]["error_code"] == E.FENCED_LEADER_EPOCH


def test_recovering_leader_reports_recovered():
    h = Harness(brokers=2)
    h.ok("CreateTopics", {"topics": [{"name": "t", "assignments": {0: [0, 1]}}]})
    h.fence(1)
    h.fence(0)
    h.unfence(1)
    _, r = h.ok(
        "ElectLeaders", {"election_type": "unclean", "partitions": [{"topic": "t", "partition": 0}]}
    )
    assert r["partitions"][0]["leader"] == 1
    p = h.part("t")
    assert (p.leader, p.isr, p.leader_recovery_state) == (1, (1,), RECOVERING)
    batch, r = alter_isr(h, [1, 0], broker=1, leader_recovery_state=RECOVERING)
    assert batch is None and r["topics"][0]["partitions"][0]["error_code"] in (
        E.INVALID_REQUEST,
        E.INELIGIBLE_REPLICA,
    )
    h.unfence(0)
    batch, r = alter_isr(h, [1, 0], broker=1, leader_recovery_state=RECOVERING)
    assert batch is None and r["topics"][0]["partitions"][0]["error_code"] == E.INVALID_REQUEST
    batch, r = alter_isr(h, [1], broker=1, leader_recovery_state=RECOVERED)
    assert h.part("t").leader_recovery_state == RECOVERED


# ---- ElectLeaders -----------------------------------------------------------------------------


def test_preferred_election():
    h = Harness(brokers=2)
    h.ok("CreateTopics", {"topics": [{"name": "t", "assignments": {0: [0, 1], 1: [1, 0]}}]})
    h.fence(0)
    h.unfence(0)
    alter_isr(h, [1, 0], broker=1)  # broker 0 back in the ISR of partition 0
    assert h.part("t", 0).leader == 1
    listed = [
        {"topic": "t", "partition": 0},
        {"topic": "t", "partition": 1},
        {"topic": "t", "partition": 9},
    ]
    batch, r = h.ok("ElectLeaders", {"election_type": "preferred", "partitions": listed})
    assert (
        batch.provenance.reason == "preferred-election" and batch.records[0].election == "preferred"
    )
    assert [(x["partition"], x["leader"], x["error_code"]) for x in r["partitions"]] == [
        (0, 0, 0),
        (1, 1, E.ELECTION_NOT_NEEDED),
        (9, -1, E.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    assert h.part("t", 0).leader == 0
    # preferred replica not in the ISR
    h.fence(0)
    h.unfence(0)
    r = h.fails("ElectLeaders", {"election_type": "preferred", "partitions": listed[:1]})
    assert r["partitions"][0]["error_code"] == E.PREFERRED_LEADER_NOT_AVAILABLE


def test_preferred_election_for_all_partitions():
    h = Harness(brokers=2)
    h.ok(
        "CreateTopics",
        {"topics": [{"name": "t", "assignments": {0: [0, 1], 1: [1, 0], 2: [0, 1]}}]},
    )
    h.fence(0)
    h.unfence(0)
    alter_isr(h, [1, 0], broker=1, pid=0)
    batch, r = h.ok("ElectLeaders", {"election_type": "preferred"})
    assert [(x["partition"], x["error_code"]) for x in r["partitions"]] == [
        (0, 0),
        (2, E.PREFERRED_LEADER_NOT_AVAILABLE),
    ]
    assert len(batch.records) == 1


def test_unclean_election_errors():
    h = Harness(brokers=2)
    h.ok("CreateTopics", {"topics": [{"name": "t", "assignments": {0: [0, 1]}}]})
    r = h.fails(
        "ElectLeaders", {"election_type": "unclean", "partitions": [{"topic": "t", "partition": 0}]}
    )
    assert r["partitions"][0]["error_code"] == E.ELECTION_NOT_NEEDED
    h.fence(1)
    h.fence(0)
    r = h.fails(
        "ElectLeaders", {"election_type": "unclean", "partitions": [{"topic": "t", "partition": 0}]}
    )
    assert r["partitions"][0]["error_code"] == E.ELIGIBLE_LEADERS_NOT_AVAILABLE


# ---- dedup window -------------------------------------------------------------------------------


def test_retried_request_is_answered_without_a_second_write():
    h = Harness(brokers=1)
    batch, first = h.ok(
        "CreateTopics", {"topics": [{"name": "t", "num_partitions": 2}]}, request_id="abc"
    )
    before = h.image
    again_batch, again = h.write(
        "CreateTopics", {"topics": [{"name": "t", "num_partitions": 2}]}, request_id="abc"
    )
    assert again_batch is None and h.image is before
    assert again["duplicate"] is True and again["offset"] == batch.last_offset
    assert again["topics"] == first["topics"]
    assert "abc" in h.sm.recent_request_ids


def test_dedup_window_is_bounded_and_forgets_failures():
    h = Harness(brokers=1, dedup_window=3)
    for i in range(5):
        h.ok("NoOp", {}, request_id=f"n{i}")
    assert h.sm.recent_request_ids == ["n2", "n3", "n4"]
    assert h.write("NoOp", {}, request_id="n4")[0] is None
    assert h.write("NoOp", {}, request_id="n0")[0] is not None  # evicted: applied again
    r1 = h.write("UnregisterBroker", {"broker_id": 9}, request_id="u")[1]
    r2 = h.write("UnregisterBroker", {"broker_id": 9}, request_id="u")[1]
    assert r1 == r2 and r1["error_code"] == E.BROKER_ID_NOT_REGISTERED and "duplicate" not in r2


def _record_batches(h: Harness) -> list:
    """From now on, every batch ``h``'s state machine proposes, in order."""
    batches: list = []
    original_propose = h.sm.propose

    def recording_propose(*a, **kw):
        batch, response, rest = original_propose(*a, **kw)
        if batch is not None:
            batches.append(batch)
        return batch, response, rest

    h.sm.propose = recording_propose
    return batches


def test_replay_rebuilds_the_same_image_and_window():
    h = Harness(brokers=2)
    batches = _record_batches(h)
    h.create("t", partitions=3, rf=2)
    h.fence(1)
    h.ok(
        "BrokerRegistration",
        {
            "broker_id": 7,
            "cluster_id": CLUSTER,
            "incarnation_id": str(uuid.uuid4()),
            "listeners": [listener(1)],
        },
        request_id="reg-7",
    )
    rebuilt = QuorumStateMachine(h.sm.settings, image=_prefix_image(h, batches))
    for b in batches:
        rebuilt.replay_batch(b)
    assert rebuilt.image.checksum() == h.image.checksum()
    dup = rebuilt.propose(Command("BrokerRegistration", {}, "reg-7"), 1)[1]
    assert dup["duplicate"] and dup["broker_epoch"] == h.epoch(7)


def test_start_up_replay_into_one_delta_gives_the_window_batch_by_batch_replay_gives():
    """The controller's start-up replays the whole log into one delta (kraft.metadata.replay)
    with note_before; the dedup window must say what replaying one batch at a time says,
    including the name of a topic a batch removed and a producer-id block's start."""
    h = Harness(brokers=2)
    batches = _record_batches(h)
    h.create("gone", partitions=2)
    h.ok("AllocateProducerIds", {"broker_id": 0, "broker_epoch": h.epoch(0)}, request_id="pid-1")
    h.ok("DeleteTopics", {"names": ["gone"]}, request_id="del-gone")
    h.create("kept")
    h.ok("AllocateProducerIds", {"broker_id": 0, "broker_epoch": h.epoch(0)}, request_id="pid-2")
    start = _prefix_image(h, batches)

    one_by_one = QuorumStateMachine(h.sm.settings, image=start)
    for b in batches:
        one_by_one.replay_batch(b)
    at_once = QuorumStateMachine(h.sm.settings, image=start)
    at_once.start_at(replay(start, batches, at_once.note_before))

    assert at_once.image.checksum() == one_by_one.image.checksum() == h.image.checksum()
    assert at_once.snapshot_state()[1] == one_by_one.snapshot_state()[1]
    window = dict(at_once.snapshot_state()[1])
    assert window["del-gone"]["topics"][0]["name"] == "gone"
    assert (
        window["pid-2"]["producer_id_start"]
        == window["pid-1"]["producer_id_start"] + (window["pid-1"]["producer_id_len"])
    )


def _prefix_image(h: Harness, batches: list) -> MetadataImage:
    """The image just before the first recorded batch, rebuilt by replaying h's earlier history."""
    target = batches[0].base_offset - 1
    fresh = Harness(brokers=2)
    assert fresh.image.offset == target and fresh.image.last_hash == batches[0].prev_hash
    return fresh.image


# ---- reads ------------------------------------------------------------------------------------


def test_reads():
    h = Harness(brokers=2, racks=["a", "b"])
    h.create("b-topic", partitions=2, rf=2, configs={"retention.ms": "7"})
    h.create("a-topic")
    h.ok("BeginControlledShutdown", {"broker_id": 1, "broker_epoch": h.epoch(1)})
    lt = h.sm.read("ListTopics", {})
    assert lt["offset"] == h.image.offset
    assert [(t["name"], t["partitions"]) for t in lt["topics"]] == [("a-topic", 1), ("b-topic", 2)]
    dt = h.sm.read("DescribeTopics", {"names": ["b-topic", "nope"]})
    b, nope = dt["topics"]
    assert (
        b["configs"] == {"retention.ms": "7"} and len(b["partitions"]) == 2 and b["error_code"] == 0
    )
    assert set(b["partitions"][0]) == {
        "partition",
        "leader",
        "leader_epoch",
        "partition_epoch",
        "replicas",
        "isr",
        "removing_replicas",
        "adding_replicas",
        "leader_recovery_state",
    }
    assert nope["error_code"] == E.UNKNOWN_TOPIC_OR_PARTITION
    assert len(h.sm.read("DescribeTopics", {})["topics"]) == 2
    dc = h.sm.read("DescribeCluster", {})
    assert (dc["cluster_id"], dc["controller_id"], dc["offset"]) == (CLUSTER, 1, h.image.offset)
    assert [(x["broker_id"], x["state"], x["rack"]) for x in dc["brokers"]] == [
        (0, "unfenced", "a"),
        (1, "controlled-shutdown", "b"),
    ]
    assert h.sm.read("CreateTopics", {"topics": []})["error_code"] == E.INVALID_REQUEST


def test_broker_transitions_beyond_one_batch_continue_over_several_commands():
    h = Harness(brokers=2, max_records_per_batch=3)
    for i in range(5):
        h.ok("CreateTopics", {"topics": [{"name": f"t{i}", "assignments": {0: [0, 1]}}]})
    body = {"broker_id": 0, "broker_epoch": h.epoch(0), "reason": "session-timeout"}
    batch, r = h.ok("FenceBroker", body)  # 2 changes + room for the fence record
    assert r["incomplete"] and len(batch.records) == 2
    assert not h.image.brokers[0].fenced
    batch, r = h.ok("FenceBroker", body)
    assert r["incomplete"] and len(batch.records) == 2
    batch, r = h.ok("FenceBroker", body)
    assert "incomplete" not in r and len(batch.records) == 2
    assert isinstance(batch.records[-1], BrokerRegistrationChangeRecord)
    assert h.image.brokers[0].fenced and all(h.part(f"t{i}").leader == 1 for i in range(5))

    while h.fence(1)[1].get("incomplete"):  # every partition ends leaderless, ISR [1]
        pass
    assert h.image.brokers[1].fenced and all(h.part(f"t{i}").leader == -1 for i in range(5))
    h.unfence(0)
    body = {"broker_id": 1, "broker_epoch": h.epoch(1)}
    batch, r = h.ok("UnfenceBroker", body)
    assert r["incomplete"] and len(batch.records) == 3
    while r.get("incomplete"):
        batch, r = h.ok("UnfenceBroker", {**body, "continue": True})
    assert all(h.part(f"t{i}").leader == 1 for i in range(5))

    alter = [
        h.ok(
            "AlterPartition",
            {
                "broker_id": 1,
                "broker_epoch": h.epoch(1),
                "topics": [
                    {
                        "topic_id": h.image.topics_by_name[f"t{i}"],
                        "partitions": [
                            {
                                "partition": 0,
                                "leader_epoch": h.part(f"t{i}").leader_epoch,
                                "partition_epoch": h.part(f"t{i}").partition_epoch,
                                "isr": [1, 0],
                            }
                        ],
                    }
                ],
            },
        )
        for i in range(5)
    ]
    assert len(alter) == 5
    body = {"broker_id": 1, "broker_epoch": h.epoch(1)}
    steps = 0
    r = {"incomplete": True}
    while r.get("incomplete"):
        batch, r = h.ok("BeginControlledShutdown", body)
        steps += 1
    assert steps == 2 and h.image.brokers[1].in_controlled_shutdown
    assert all(h.part(f"t{i}").leader == 0 for i in range(5))
    assert h.fails("BeginControlledShutdown", body)["error_code"] == 0  # nothing left to move


def test_stepped_transitions_write_the_same_batches_with_or_without_the_pending_rest():
    """A stepped fence/shutdown hands its unwritten changes to the next step; a controller that
    lost them (restarted mid-way, or something else was written in between) recomputes them and
    must write byte-identical batches."""
    hits = []

    def run(forget: bool, interleave: bool) -> list[bytes]:
        h = Harness(brokers=3, max_records_per_batch=4)
        for i in range(6):
            h.ok(
                "CreateTopics",
                {"topics": [{"name": f"t{i}", "num_partitions": 2, "replication_factor": 3}]},
            )
        out = []
        for api, bid, extra in (
            ("BeginControlledShutdown", 1, {}),
            ("FenceBroker", 2, {"reason": "session-timeout"}),
        ):
            r = {"incomplete": True}
            steps = 0
            h.forget_resume = forget
            while r.get("incomplete"):
                if interleave and steps == 1:
                    batch, _ = alter(
                        h, [{"name": "retention.ms", "op": "SET", "value": str(bid)}], name="t0"
                    )
                    out.append(batch.encode())
                body = {"broker_id": bid, "broker_epoch": h.epoch(bid), **extra}
                batch, r = h.ok(api, body)
                hits.append(h.resumed[-1])
                out.append(batch.encode() if batch is not None else b"")
                steps += 1
            assert steps > 2
        assert h.image.brokers[2].fenced and h.image.brokers[1].in_controlled_shutdown
        assert all(
            p.leader == 0 for t in h.image.topics_by_id.values() for p in t.partitions.values()
        )
        return out

    assert run(forget=False, interleave=False) == run(forget=True, interleave=False)
    assert any(hits) and not any(hits[len(hits) // 2 :])  # used when kept, never when forgotten
    hits.clear()
    assert run(forget=False, interleave=True) == run(forget=True, interleave=True)


def test_broker_transition_steps_are_capped_by_transition_step_records(monkeypatch):
    """A fence moves at most ``transition_step_records`` partitions per command even when a user
    batch may hold more, and each later step resumes where the previous one stopped instead of
    scanning from the first topic."""
    from kraft.controller import election

    h = Harness(brokers=2, transition_step_records=4)
    for t in ("a", "b", "c"):
        h.ok(
            "CreateTopics", {"topics": [{"name": t, "assignments": {i: [0, 1] for i in range(3)}}]}
        )
    body = {"broker_id": 0, "broker_epoch": h.epoch(0), "reason": "session-timeout"}
    resumed = []
    original = election.leaving_changes

    def spy(image, broker_id, unclean_allowed, limit=None, resume=None, also=frozenset()):
        resumed.append(resume)
        return original(image, broker_id, unclean_allowed, limit, resume, also)

    sizes = []
    monkeypatch.setattr("kraft.controller.replication_control.leaving_changes", spy)
    r = {"incomplete": True}
    while r.get("incomplete"):
        batch, r = h.ok("FenceBroker", body)
        sizes.append(len(batch.records))
    # 9 changes, 3 per step (one record of room kept for the fence record, written with the last)
    assert sizes == [3, 3, 4] and resumed == [None, (0, "b", 0, ()), (0, "c", 0, ())]
    assert h.image.brokers[0].fenced
    assert all(
        p.leader == 1 and p.isr == (1,) for t in "abc" for p in h.image.topic(t).partitions.values()
    )
    with pytest.raises(ValueError):
        ControllerSettings(CLUSTER, transition_step_records=1)


def test_a_stepped_fence_moves_every_leadership_before_any_isr_only_change():
    """A broker leading some partitions and only following others: the steps move the
    leaderships first (those partitions are unavailable until then), in every topic, and only
    then take it out of the other ISRs; the resumed scan and a scan from the start agree."""

    def run(forget: bool) -> list[list[tuple[str, int, bool]]]:
        h = Harness(brokers=3, transition_step_records=3)
        for t in ("a", "b", "c"):
            layout = {0: [0, 1], 1: [1, 0], 2: [0, 2], 3: [2, 0]}  # 0 leads two, follows two
            h.ok("CreateTopics", {"topics": [{"name": t, "assignments": layout}]})
        names = {h.image.topics_by_name[t]: t for t in "abc"}
        body = {"broker_id": 0, "broker_epoch": h.epoch(0), "reason": "session-timeout"}
        h.forget_resume = forget
        steps, r = [], {"incomplete": True}
        while r.get("incomplete"):
            batch, r = h.ok("FenceBroker", body)
            steps.append(
                [
                    (names[rec.topic_id], rec.partition_id, rec.leader != LEADER_UNCHANGED)
                    for rec in batch.records
                    if isinstance(rec, PartitionChangeRecord)
                ]
            )
        assert h.image.brokers[0].fenced
        return steps

    steps = run(forget=False)
    flat = [change for step in steps for change in step]
    assert flat == [(t, p, True) for t in "abc" for p in (0, 2)] + [
        (t, p, False) for t in "abc" for p in (1, 3)
    ]
    assert len(steps) == 6 and run(forget=True) == steps  # 2 changes + room for the fence


def test_brokers_whose_sessions_expired_together_are_fenced_together():
    """FenceBroker with ``also``: one change per partition for all the leaving brokers (not one
    per replica), every fence record last, in steps that resume or rescan alike; a stale or
    already fenced ``also`` entry is left out."""

    def run(forget: bool) -> tuple[list[bytes], Harness]:
        h = Harness(brokers=4, transition_step_records=4)
        layout = {0: [0, 1, 2], 1: [1, 2, 3], 2: [2, 0, 3], 3: [3, 2, 1], 4: [1, 0, 2]}
        for t in ("a", "b"):
            h.ok("CreateTopics", {"topics": [{"name": t, "assignments": layout}]})
        h.forget_resume = forget
        body = {
            "broker_id": 0,
            "broker_epoch": h.epoch(0),
            "reason": "session-timeout",
            "also": [
                {"broker_id": 1, "broker_epoch": h.epoch(1)},
                {"broker_id": 3, "broker_epoch": h.epoch(3) + 7},  # stale: left out
                {"broker_id": 0, "broker_epoch": h.epoch(0)},  # itself: left out
            ],
        }
        out, r = [], {"incomplete": True}
        while r.get("incomplete"):
            batch, r = h.ok("FenceBroker", body)
            out.append(batch.encode())
        return out, h

    encoded, h = run(forget=False)
    assert run(forget=True)[0] == encoded
    batches = [decode_batch(e) for e in encoded]
    changes = [r for b in batches for r in b.records if isinstance(r, PartitionChangeRecord)]
    fences = [r for r in batches[-1].records if isinstance(r, BrokerRegistrationChangeRecord)]
    assert [(f.broker_id, f.fenced) for f in fences] == [(0, 1), (1, 1)]
    assert batches[-1].records[-2:] == tuple(fences)  # written last
    touched = [(r.topic_id, r.partition_id) for r in changes]
    assert len(touched) == len(set(touched)) == 10  # each partition once: 0 or 1 in every ISR
    assert h.image.brokers[0].fenced and h.image.brokers[1].fenced
    assert not h.image.brokers[3].fenced
    for t in ("a", "b"):
        for p in h.image.topic(t).partitions.values():
            assert p.leader in (2, 3) and not {0, 1} & set(p.isr)
    for i, rec in enumerate(changes):  # leaderships first
        if rec.leader == LEADER_UNCHANGED:
            assert all(r.leader == LEADER_UNCHANGED for r in changes[i:])
            break


def test_a_fence_does_not_examine_partitions_it_cannot_change(monkeypatch):
    """After the leaderships moved, a partition whose whole ISR is leaving (its last members
    stay, no unclean election) cannot change: the second pass skips it instead of building a
    no-op for each, which at 2M partitions made one step scan the image past the election
    timeout."""
    from kraft.controller import election

    h = Harness(brokers=3, transition_step_records=4)
    layout = {i: [0, 1] for i in range(6)}  # only brokers 0 and 1 hold these
    h.ok("CreateTopics", {"topics": [{"name": "t", "assignments": layout}]})
    calls = []
    original = election.leaving_change

    def spy(*args):
        calls.append(args[1])
        return original(*args)

    monkeypatch.setattr(election, "leaving_change", spy)
    body = {
        "broker_id": 0,
        "broker_epoch": h.epoch(0),
        "reason": "session-timeout",
        "also": [{"broker_id": 1, "broker_epoch": h.epoch(1)}],
    }
    records, r = 0, {"incomplete": True}
    while r.get("incomplete"):
        batch, r = h.ok("FenceBroker", body)
        records += sum(isinstance(x, PartitionChangeRecord) for x in batch.records)
    assert records == 6 and sorted(calls) == list(range(6))  # each leadership once, nothing else
    assert all(p.leader == LEADER_NONE for p in h.image.topic("t").partitions.values())


def test_a_fence_start_found_in_slices_gives_the_same_steps():
    """``leaving_start`` finds, a few topics per call, where a leaving transition's first change
    is; a step resumed there writes what a step scanning from the start writes, at every stage
    of a transition, for one broker and for several fenced together, and for nothing to do."""
    from kraft.controller.election import leaving_changes, leaving_start

    h = Harness(brokers=4, transition_step_records=4)
    layouts = [{0: [1, 2], 1: [2, 3]}, {0: [0, 1], 1: [1, 0], 2: [3, 0]}, {0: [2, 3]}]
    for i, layout in enumerate(layouts * 2):
        h.ok("CreateTopics", {"topics": [{"name": f"t{i}", "assignments": layout}]})

    def found_in_slices(image, broker_id, also):
        point, over, calls = None, False, 0
        while not over:
            point, over = leaving_start(image, broker_id, resume=point, also=also, max_topics=1)
            calls += 1
        return point, calls

    for broker_id, also in ((0, frozenset()), (0, frozenset({1})), (3, frozenset({2}))):
        image = h.image
        while True:
            expected = leaving_changes(image, broker_id, limit=3, also=also)
            point, calls = found_in_slices(image, broker_id, also)
            assert leaving_changes(image, broker_id, limit=3, resume=point, also=also) == expected
            assert calls >= 2  # it did go a topic at a time
            if expected[1] is None:
                break
            image = image_after(image, expected[0])
    nobody = frozenset()
    point, _ = found_in_slices(h.image, 99, nobody)  # not a replica anywhere
    assert leaving_changes(h.image, 99, limit=3, resume=point) == ([], None)


@pytest.mark.parametrize(
    "api", ["FenceBroker", "BeginControlledShutdown", "UnregisterBroker", "UnfenceBroker"]
)
def test_the_server_finds_a_transition_start_and_its_first_step_uses_it(api):
    """``ControllerServer._transition_start`` (run here on a stand-in with the server's
    attributes it reads): the point it hands the first step of each stepped transition is valid
    at the image's position, and the step it leads to is the one a scan from the start gives."""
    from types import SimpleNamespace

    import trio

    from kraft.controller_server import ControllerServer

    h = Harness(brokers=3, transition_step_records=4)
    for i in range(5):
        h.ok("CreateTopics", {"topics": [{"name": f"t{i}", "assignments": {0: [1, 2], 1: [0, 2]}}]})
    if api == "UnfenceBroker":  # every partition leaderless, broker 0 the last in t*-1's ISR
        for b in (2, 1, 0):
            while h.fence(b)[1].get("incomplete"):
                pass
    body = {"broker_id": 0, "broker_epoch": h.epoch(0), "reason": "session-timeout"}
    server = SimpleNamespace(speculative=h.sm, settings=h.sm.settings)
    server._start_search = lambda *a: ControllerServer._start_search(server, *a)
    found = trio.run(ControllerServer._transition_start, server, api, body)
    assert found is not None and found[1] == (h.image.offset, h.image.last_hash)
    assert found[0][:3] == (0, "t0", 1)  # broker 0 leads, or can lead, partition 1 of each
    command = Command(api=api, body=body, request_id="f", timestamp_ms=1, seed=1)
    with_start = QuorumStateMachine(h.sm.settings, h.image).propose(command, 1, found[0])
    from_scratch = QuorumStateMachine(h.sm.settings, h.image).propose(command, 1)
    assert with_start[0].encode() == from_scratch[0].encode()
    assert with_start[2] == from_scratch[2] is not None  # both go on at the same point
    stale = dict(body, broker_epoch=h.epoch(0) + 1)
    if api != "UnregisterBroker":  # it takes no epoch
        assert trio.run(ControllerServer._transition_start, server, api, stale) is None
    gone = dict(body, broker_id=99)
    assert trio.run(ControllerServer._transition_start, server, api, gone) is None


def test_an_unfence_start_found_in_slices_gives_the_same_steps():
    """``returning_start`` finds, a few topics per call, where an unfence's first change is;
    a step resumed there writes what a step scanning from the start writes, at every stage,
    with and without offline replicas, unclean elections allowed or not, and for nothing to
    do."""
    from kraft.controller.election import returning_changes, returning_start

    h = Harness(brokers=3, transition_step_records=4)
    layouts = [{0: [1, 2], 1: [2, 0]}, {0: [0, 1], 1: [1, 0], 2: [2, 0]}, {0: [2, 1]}]
    for i, layout in enumerate(layouts * 2):
        h.ok("CreateTopics", {"topics": [{"name": f"t{i}", "assignments": layout}]})
    for b in (2, 1, 0):
        while h.fence(b)[1].get("incomplete"):
            pass
    offline_t1 = frozenset({(h.image.topics_by_name["t1"], 1)})

    def found_in_slices(image, broker_id, unclean, offline):
        point, over, calls = None, False, 0
        while not over:
            point, over = returning_start(image, broker_id, unclean, point, offline, max_topics=1)
            calls += 1
        return point, calls

    for broker_id in (0, 1, 2):
        for unclean in (lambda t: False, lambda t: t.name in ("t2", "t5")):
            for offline in (frozenset(), offline_t1):
                image = h.image
                while True:
                    expected = returning_changes(image, broker_id, unclean, 3, None, offline)
                    point, calls = found_in_slices(image, broker_id, unclean, offline)
                    assert calls >= 2
                    got = returning_changes(image, broker_id, unclean, 3, point, offline)
                    assert got == expected
                    if expected[1] is None:
                        break
                    image = image_after(image, expected[0])
    point, _ = found_in_slices(h.image, 99, lambda t: False, frozenset())
    assert returning_changes(h.image, 99, limit=3, resume=point) == ([], None)


def test_stepped_unfences_write_the_same_batches_with_or_without_the_pending_rest():
    """An unfence moving more leaderships than one step holds hands its resume point to the
    next step; a controller without it (restarted, or something else written in between)
    scans from the start and writes byte-identical batches."""
    hits = []

    def run(forget: bool, interleave: bool) -> list[bytes]:
        h = Harness(brokers=3, max_records_per_batch=4)
        for i in range(6):
            h.ok(
                "CreateTopics",
                {"topics": [{"name": f"t{i}", "num_partitions": 2, "replication_factor": 3}]},
            )
        for b in (1, 2, 0):
            while h.fence(b)[1].get("incomplete"):
                pass
        out = []
        body = {"broker_id": 0, "broker_epoch": h.epoch(0)}
        h.forget_resume = forget
        r = {"incomplete": True}
        steps = 0
        while r.get("incomplete"):
            if interleave and steps == 1:
                batch, _ = alter(
                    h, [{"name": "retention.ms", "op": "SET", "value": "7"}], name="t0"
                )
                out.append(batch.encode())
            batch, r = h.ok("UnfenceBroker", {**body, "continue": True} if steps else body)
            hits.append(h.resumed[-1])
            out.append(batch.encode())
            steps += 1
        assert steps > 2
        assert not h.image.brokers[0].fenced
        assert all(
            p.leader == 0 for t in h.image.topics_by_id.values() for p in t.partitions.values()
        )
        return out

    assert run(forget=False, interleave=False) == run(forget=True, interleave=False)
    assert any(hits) and not any(hits[len(hits) // 2 :])
    hits.clear()
    assert run(forget=False, interleave=True) == run(forget=True, interleave=True)


def image_after(image, records):
    """``image`` with ``records`` replayed (a step's changes, outside any state machine)."""
    from kraft.metadata.delta import MetadataDelta

    delta = MetadataDelta(image)
    for record in records:
        delta.replay(record)
    return delta.apply()


def test_a_stepped_fence_hands_on_where_to_resume_while_steps_are_left():
    """Each step but the last returns where the next one resumes (the node passes it on)."""
    h = Harness(brokers=3, max_records_per_batch=4)
    for i in range(6):
        h.ok(
            "CreateTopics",
            {"topics": [{"name": f"t{i}", "num_partitions": 2, "replication_factor": 3}]},
        )
    assert not h._resume
    seen = []
    r = {"incomplete": True}
    while r.get("incomplete"):
        _, r = h.ok(
            "FenceBroker", {"broker_id": 2, "broker_epoch": h.epoch(2), "reason": "session-timeout"}
        )
        seen.append(bool(h._resume))
    assert len(seen) > 2 and all(seen[:-1]) and not seen[-1]


def test_legacy_alter_configs_replaces_the_whole_set():
    h = Harness(brokers=1)
    h.create("t")
    alter(
        h,
        [
            {"name": "retention.ms", "op": "SET", "value": "100"},
            {"name": "max.message.bytes", "op": "SET", "value": "5000"},
        ],
    )
    body = {
        "resources": [
            {
                "resource_type": "topic",
                "resource_name": "t",
                "ops": [{"name": "retention.ms", "op": "SET", "value": "200"}],
            }
        ]
    }
    batch, r = h.write("AlterConfigs", body)
    assert r["resources"][0]["error_code"] == 0
    assert h.image.config(2, "t") == {"retention.ms": "200"}  # max.message.bytes deleted
    body["resources"][0]["ops"] = [{"name": "retention.ms", "op": "DELETE"}]
    _, r = h.write("AlterConfigs", body)
    assert r["resources"][0]["error_code"] == E.INVALID_REQUEST
    assert h.image.config(2, "t") == {"retention.ms": "200"}
