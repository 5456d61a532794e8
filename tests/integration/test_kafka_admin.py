"""Unit tests: Kafka admin requests (kio entities, every served version) ↔ controller RPC bodies."""

from __future__ import annotations

import io
import struct
import time
import uuid
from datetime import timedelta

import pytest
import trio
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode as K
from kio.serial import entity_reader, entity_writer

from broker.metadata.metadata_cache import MetadataCache
from broker.protocol import admin_mapping as m
from broker.protocol.admin_decode import decode_request, strip_tagged_fields
from broker.protocol.kafka_admin import (
    DEFAULT_TIMEOUT_S,
    RANGES,
    KafkaAdmin,
    build_entity,
    request_timeout,
)
from broker.protocol.kafka_codec import (
    DecodeError,
    Reader,
    RequestHeader,
    encode_body,
    response_class,
)
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.registrations import BrokerRegistration
from kraft.rpc.client import ControllerClient
from tools.free_ports import pick_free_ports


def request(api_key: int, version: int, values: dict) -> object:
    """A request entity as a client would send it: built, encoded, then decoded by the broker."""
    cls = load_request_schema(api_key, version)
    buf = io.BytesIO()
    entity_writer(cls)(buf, build_entity(cls, values))
    return decode_request(
        RequestHeader(api_key, version, 1, "test"), Reader(buf.getvalue() + b"\x00\x01")
    )


def encodes(api_key: int, version: int, values: dict) -> object:
    """Encode response values for a version and decode them back (proves the shape is valid)."""
    cls = response_class(api_key, version)
    data = encode_body(build_entity(cls, values))
    return entity_reader(cls)(data, 0)[0]


def versions(api_key: int) -> range:
    lo, hi = RANGES[api_key]
    return range(lo, hi + 1)


TOPIC_ID = str(uuid.uuid4())


# ---- CreateTopics ----------------------------------------------------------------------------


def _create_req(version: int) -> object:
    return request(
        19,
        version,
        {
            "topics": [
                {
                    "name": "orders",
                    "num_partitions": 3,
                    "replication_factor": 2,
                    "assignments": [],
                    "configs": [{"name": "retention.ms", "value": "1000"}],
                },
                {
                    "name": "manual",
                    "num_partitions": -1,
                    "replication_factor": -1,
                    "assignments": [
                        {"partition_index": 0, "broker_ids": [101, 102]},
                        {"partition_index": 1, "broker_ids": [102, 101]},
                    ],
                    "configs": [],
                },
                {
                    "name": "dup",
                    "num_partitions": 1,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [{"name": "a", "value": "1"}, {"name": "a", "value": "2"}],
                },
                {
                    "name": "nullcfg",
                    "num_partitions": 1,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [{"name": "retention.ms", "value": None}],
                },
            ],
            "timeout": timedelta(milliseconds=5000),
            "validate_only": True,
        },
    )


@pytest.mark.parametrize("version", versions(19))
def test_create_topics_body_and_response(version: int) -> None:
    req = _create_req(version)
    body, refused = m.create_topics_body(req)
    assert body == {
        "validate_only": True,
        "topics": [
            {
                "name": "orders",
                "num_partitions": 3,
                "replication_factor": 2,
                "configs": {"retention.ms": "1000"},
            },
            {
                "name": "manual",
                "num_partitions": -1,
                "replication_factor": -1,
                "assignments": {0: [101, 102], 1: [102, 101]},
            },
        ],
    }
    assert (
        refused[2]["error_code"] == K.invalid_config
        and "more than once" in refused[2]["error_message"]
    )
    assert (
        refused[3]["error_code"] == K.invalid_config and "Null value" in refused[3]["error_message"]
    )
    results = [
        {
            "name": "orders",
            "topic_id": TOPIC_ID,
            "error_code": 0,
            "error_message": "",
            "num_partitions": 3,
            "replication_factor": 2,
        },
        {
            "name": "manual",
            "topic_id": "",
            "error_code": int(ErrorCode.TOPIC_ALREADY_EXISTS),
            "error_message": "Topic 'manual' already exists.",
            "num_partitions": -1,
            "replication_factor": -1,
        },
    ]
    described = {
        "orders": {
            "resource_type": "topic",
            "resource_name": "orders",
            "error_code": 0,
            "error_message": "",
            "configs": CONTROLLER_CONFIGS,
        }
    }
    resp = encodes(19, version, m.create_topics_values(req, results, refused, described))
    assert [t.name for t in resp.topics] == ["orders", "manual", "dup", "nullcfg"]
    ok, exists, dup, null = resp.topics
    assert ok.error_code == K.none and ok.error_message is None
    assert (
        exists.error_code == K.topic_already_exists
        and exists.error_message == "Topic 'manual' already exists."
    )
    assert dup.error_code == null.error_code == K.invalid_config
    if version >= 5:
        assert (ok.num_partitions, ok.replication_factor) == (3, 2)
        assert exists.num_partitions == -1 and exists.configs is None
        assert [(c.name, c.value, c.config_source) for c in ok.configs] == [
            ("cleanup.policy", "compact", m.SOURCE_DYNAMIC_TOPIC),
            ("retention.ms", "604800000", m.SOURCE_DEFAULT),
        ]
    if version >= 7:
        assert ok.topic_id == uuid.UUID(TOPIC_ID) and exists.topic_id in (
            None,
            m.NO_ID,
        )  # kio reads zero as None


def test_create_topics_configs_not_described() -> None:
    req = request(
        19,
        7,
        {
            "topics": [
                {
                    "name": "t",
                    "num_partitions": 1,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [],
                }
            ],
            "timeout": timedelta(0),
            "validate_only": False,
        },
    )
    created = [
        {
            "name": "t",
            "topic_id": TOPIC_ID,
            "error_code": 0,
            "error_message": "",
            "num_partitions": 1,
            "replication_factor": 1,
        }
    ]
    late = m.failed(KraftError(ErrorCode.REQUEST_TIMED_OUT, "late"))
    topic = encodes(19, 7, m.create_topics_values(req, created, {}, {"t": late})).topics[0]
    assert topic.error_code == K.none and topic.topic_config_error_code == K.request_timed_out
    assert topic.configs is None


def test_create_topics_forwarding_failure_fails_every_topic() -> None:
    req = _create_req(7)
    body, refused = m.create_topics_body(req)
    failure = m.failed(KraftError(ErrorCode.REQUEST_TIMED_OUT, "no answer"))
    values = m.create_topics_values(req, [failure] * len(body["topics"]), refused)
    codes = [t["error_code"] for t in values["topics"]]
    assert codes == [K.request_timed_out, K.request_timed_out, K.invalid_config, K.invalid_config]


def test_request_timeout() -> None:
    assert request_timeout(_create_req(7)) == 5.0
    zero = request(19, 4, {"topics": [], "timeout": timedelta(0), "validate_only": False})
    assert request_timeout(zero) == DEFAULT_TIMEOUT_S


# ---- DeleteTopics ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", versions(20))
def test_delete_topics(version: int) -> None:
    unknown = uuid.uuid4()
    if version >= 6:
        req = request(
            20,
            version,
            {
                "topics": [
                    {"name": "orders", "topic_id": m.NO_ID},
                    {"name": None, "topic_id": uuid.UUID(TOPIC_ID)},
                    {"name": None, "topic_id": unknown},
                ],
                "timeout": timedelta(seconds=1),
            },
        )
    else:
        req = request(
            20,
            version,
            {"topic_names": ["orders", "payments", "ghost"], "timeout": timedelta(seconds=1)},
        )
    requested = m.delete_topic_names(req, {TOPIC_ID: "payments"})
    if version >= 6:
        assert requested == [("orders", None), ("payments", uuid.UUID(TOPIC_ID)), (None, unknown)]
    names = [n for n, _ in requested if n]
    results = [
        {"name": "orders", "topic_id": TOPIC_ID, "error_code": 0, "error_message": ""},
        {
            "name": "payments",
            "topic_id": "",
            "error_code": 3,
            "error_message": "Topic 'payments' does not exist.",
        },
        {
            "name": "ghost",
            "topic_id": "",
            "error_code": 3,
            "error_message": "Topic 'ghost' does not exist.",
        },
    ]
    resp = encodes(20, version, m.delete_topics_values(requested, results[: len(names)]))
    codes = [r.error_code for r in resp.responses]
    assert codes[:2] == [K.none, K.unknown_topic_or_partition]
    assert codes[2] == (K.unknown_topic_id if version >= 6 else K.unknown_topic_or_partition)
    if version >= 5:
        assert resp.responses[1].error_message == "Topic 'payments' does not exist."


# ---- CreatePartitions ------------------------------------------------------------------------


@pytest.mark.parametrize("version", versions(37))
def test_create_partitions(version: int) -> None:
    req = request(
        37,
        version,
        {
            "topics": [
                {"name": "orders", "count": 4, "assignments": None},
                {"name": "audit", "count": 2, "assignments": [{"broker_ids": [103, 101]}]},
            ],
            "timeout": timedelta(seconds=1),
            "validate_only": False,
        },
    )
    assert m.create_partitions_body(req) == {
        "validate_only": False,
        "topics": [
            {"name": "orders", "count": 4},
            {"name": "audit", "count": 2, "assignments": [[103, 101]]},
        ],
    }
    results = [
        {"name": "orders", "error_code": 0, "error_message": ""},
        {"name": "audit", "error_code": 37, "error_message": "Topic already has 3 partitions."},
    ]
    resp = encodes(37, version, m.create_partitions_values(req, results))
    assert [(r.name, r.error_code, r.error_message) for r in resp.results] == [
        ("orders", K.none, None),
        ("audit", K.invalid_partitions, "Topic already has 3 partitions."),
    ]


# ---- configs ---------------------------------------------------------------------------------

CONTROLLER_CONFIGS = [
    {
        "name": "cleanup.policy",
        "value": "compact",
        "source": "dynamic",
        "read_only": False,
        "sensitive": False,
    },
    {
        "name": "retention.ms",
        "value": "604800000",
        "source": "default",
        "read_only": False,
        "sensitive": False,
    },
]


@pytest.mark.parametrize("version", versions(32))
def test_describe_configs(version: int) -> None:
    req = request(
        32,
        version,
        {
            "resources": [
                {"resource_type": 2, "resource_name": "orders", "configuration_keys": None},
                {"resource_type": 8, "resource_name": "101", "configuration_keys": None},
                {"resource_type": 4, "resource_name": "", "configuration_keys": ["retention.ms"]},
                {"resource_type": 2, "resource_name": "ghost", "configuration_keys": None},
                {"resource_type": 2, "resource_name": "orders", "configuration_keys": []},
            ],
            "include_synonyms": True,
            "include_documentation": True,
        },
    )
    body, refused = m.describe_configs_body(req)
    assert body == {
        "resources": [
            {"resource_type": "topic", "resource_name": "orders"},
            {"resource_type": "broker", "resource_name": ""},
            {"resource_type": "topic", "resource_name": "ghost"},
            {"resource_type": "topic", "resource_name": "orders"},
        ]
    }
    assert list(refused) == [1] and refused[1]["error_code"] == K.invalid_request
    results = [
        {
            "resource_type": "topic",
            "resource_name": "orders",
            "error_code": 0,
            "error_message": "",
            "configs": CONTROLLER_CONFIGS,
        },
        {
            "resource_type": "broker",
            "resource_name": "",
            "error_code": 0,
            "error_message": "",
            "configs": [{**c, "source": "dynamic"} for c in CONTROLLER_CONFIGS],
        },
        {
            "resource_type": "topic",
            "resource_name": "ghost",
            "error_code": 3,
            "error_message": "Topic 'ghost' does not exist.",
            "configs": [],
        },
        {
            "resource_type": "topic",
            "resource_name": "orders",
            "error_code": 0,
            "error_message": "",
            "configs": CONTROLLER_CONFIGS,
        },
    ]
    resp = encodes(32, version, m.describe_configs_values(req, results, refused))
    topic, logger, defaults, ghost, empty_keys = resp.results
    assert len(empty_keys.configs) == 2  # an empty key list means all keys, as in Kafka
    assert topic.error_code == K.none and [c.name for c in topic.configs] == [
        "cleanup.policy",
        "retention.ms",
    ]
    assert [c.config_source for c in topic.configs] == [m.SOURCE_DYNAMIC_TOPIC, m.SOURCE_DEFAULT]
    assert topic.configs[0].synonyms[0].name == "cleanup.policy"
    assert logger.error_code == K.invalid_request and logger.resource_type == 8
    assert [c.name for c in defaults.configs] == ["retention.ms"]
    assert defaults.configs[0].config_source == m.SOURCE_DYNAMIC_DEFAULT_BROKER
    assert ghost.error_code == K.unknown_topic_or_partition and ghost.configs == ()
    if version >= 3:
        assert topic.configs[0].config_type == 7 and topic.configs[1].config_type == 5
        assert topic.configs[0].documentation


def test_broker_config_source() -> None:
    out = m.config_entries(
        4, "101", [{**CONTROLLER_CONFIGS[0], "name": "min.insync.replicas"}], None, False, False
    )
    assert out[0]["config_source"] == m.SOURCE_DYNAMIC_BROKER and out[0]["synonyms"] == []


@pytest.mark.parametrize("version", versions(44))
def test_incremental_alter_configs(version: int) -> None:
    req = request(
        44,
        version,
        {
            "resources": [
                {
                    "resource_type": 2,
                    "resource_name": "orders",
                    "configs": [
                        {"name": "retention.ms", "config_operation": 0, "value": "1000"},
                        {"name": "segment.ms", "config_operation": 1, "value": None},
                        {"name": "cleanup.policy", "config_operation": 2, "value": "compact"},
                        {"name": "x", "config_operation": 9, "value": "y"},
                    ],
                },
                {"resource_type": 16, "resource_name": "metrics", "configs": []},
            ],
            "validate_only": True,
        },
    )
    body, refused = m.incremental_alter_configs_body(req)
    assert body == {
        "validate_only": True,
        "resources": [
            {
                "resource_type": "topic",
                "resource_name": "orders",
                "ops": [
                    {"name": "retention.ms", "op": "SET", "value": "1000"},
                    {"name": "segment.ms", "op": "DELETE"},
                    {"name": "cleanup.policy", "op": "APPEND", "value": "compact"},
                    {"name": "x", "op": "9", "value": "y"},
                ],
            }
        ],
    }
    results = [
        {
            "resource_type": "topic",
            "resource_name": "orders",
            "error_code": 42,
            "error_message": "Unknown op '9' for x",
        }
    ]
    resp = encodes(44, version, m.alter_configs_values(req, results, refused))
    assert [(r.resource_name, r.error_code) for r in resp.responses] == [
        ("orders", K.invalid_request),
        ("metrics", K.invalid_request),
    ]
    assert resp.responses[0].error_message == "Unknown op '9' for x"


# ---- ElectLeaders ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", versions(43))
def test_elect_leaders(version: int) -> None:
    req = request(
        43,
        version,
        {
            "election_type": 1,
            "timeout": timedelta(seconds=1),
            "topic_partitions": [
                {"topic": "orders", "partitions": [0, 1]},
                {"topic": "audit", "partitions": [0]},
            ],
        },
    )
    body = m.elect_leaders_body(req)
    assert body == {
        "election_type": "unclean" if version >= 1 else "preferred",
        "partitions": [
            {"topic": "orders", "partition": 0},
            {"topic": "orders", "partition": 1},
            {"topic": "audit", "partition": 0},
        ],
    }
    results = [
        {"topic": "orders", "partition": 0, "leader": 101, "error_code": 0, "error_message": ""},
        {
            "topic": "orders",
            "partition": 1,
            "leader": 102,
            "error_code": 84,
            "error_message": "not needed",
        },
        {"topic": "audit", "partition": 0, "leader": -1, "error_code": 3, "error_message": "gone"},
    ]
    resp = encodes(43, version, m.elect_leaders_values(results))
    got = {
        (r.topic, p.partition_id): p.error_code
        for r in resp.replica_election_results
        for p in r.partition_result
    }
    assert got == {
        ("orders", 0): K.none,
        ("orders", 1): K.election_not_needed,
        ("audit", 0): K.unknown_topic_or_partition,
    }
    everything = request(
        43, version, {"election_type": 0, "timeout": timedelta(0), "topic_partitions": None}
    )
    assert m.elect_leaders_body(everything) == {"election_type": "preferred", "partitions": None}


def test_elect_leaders_bad_type_and_failure() -> None:
    req = request(
        43,
        2,
        {
            "election_type": 7,
            "timeout": timedelta(0),
            "topic_partitions": [{"topic": "orders", "partitions": [0]}],
        },
    )
    assert m.elect_leaders_body(req) == K.invalid_request
    failed = m.elect_leaders_failed(req, m.failed(KraftError(ErrorCode.REQUEST_TIMED_OUT, "late")))
    resp = encodes(43, 2, m.elect_leaders_values(failed, K.request_timed_out, "late"))
    assert resp.error_code == K.request_timed_out
    assert resp.replica_election_results[0].partition_result[0].error_code == K.request_timed_out


# ---- DescribeCluster -------------------------------------------------------------------------


class _Image:
    def __init__(self) -> None:
        ep = (
            {
                "name": "PLAINTEXT",
                "host": "127.0.0.1",
                "port": 9092,
                "security_protocol": "PLAINTEXT",
            },
        )
        self.brokers = {
            bid: BrokerRegistration(bid, str(uuid.uuid4()), 5, ep, (), "r1", bid == 101, False)
            for bid in (101, 102, 103)
        }


@pytest.mark.parametrize("version", versions(60))
def test_describe_cluster(version: int) -> None:
    values = m.describe_cluster_values(_Image(), "cid", "PLAINTEXT", 1, include_fenced=False)
    resp = encodes(60, version, values)
    assert resp.cluster_id == "cid" and resp.controller_id == 102
    assert [b.broker_id for b in resp.brokers] == [102, 103]
    with_fenced = m.describe_cluster_values(_Image(), "cid", "PLAINTEXT", 1, include_fenced=True)
    assert [(b["broker_id"], b["is_fenced"]) for b in with_fenced["brokers"]] == [
        (101, True),
        (102, False),
        (103, False),
    ]
    controllers = m.describe_cluster_values(_Image(), "cid", "PLAINTEXT", 2, include_fenced=False)
    assert controllers["error_code"] == K.unsupported_endpoint_type and controllers["brokers"] == []


# ---- decoding --------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [b"", b"\xff" * 40, b"\x00\x00\x00\x05ab"])
def test_undecodable_request_raises_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_request(RequestHeader(19, 7, 1, "x"), Reader(data))


def test_every_served_version_is_known_to_kio() -> None:
    for key, (lo, hi) in RANGES.items():
        for v in range(lo, hi + 1):
            load_request_schema(key, v)
            response_class(key, v)


# ---- handle(): framing, and no controller to forward to ---------------------------------------


def _unused_port() -> int:
    return pick_free_ports(1)[0]


def test_handle_without_a_reachable_controller_times_out_per_topic() -> None:
    """A real ControllerClient whose controller refuses connections: every topic gets
    REQUEST_TIMED_OUT after the request's own timeout, never NOT_CONTROLLER."""
    cls = load_request_schema(19, 7)
    buf = io.BytesIO()
    entity_writer(cls)(
        buf,
        build_entity(
            cls,
            {
                "topics": [
                    {
                        "name": n,
                        "num_partitions": 1,
                        "replication_factor": 1,
                        "assignments": [],
                        "configs": [],
                    }
                    for n in ("a", "b")
                ],
                "timeout": timedelta(milliseconds=500),
                "validate_only": False,
            },
        ),
    )

    async def main() -> bytes:
        client = ControllerClient([("127.0.0.1", _unused_port())], connect_timeout=0.2)
        try:
            admin = KafkaAdmin(MetadataCache("cid"), client, 101)
            return await admin.handle(RequestHeader(19, 7, 42, "app"), Reader(buf.getvalue()))
        finally:
            await client.aclose()

    started = time.monotonic()
    frame = trio.run(main)
    assert time.monotonic() - started < 10
    size, correlation_id = struct.unpack_from(">ii", frame)
    assert size == len(frame) - 4 and correlation_id == 42
    resp = entity_reader(response_class(19, 7))(frame, 9)[0]  # flexible response header: id + tags
    assert [t.error_code for t in resp.topics] == [K.request_timed_out] * 2
    assert resp.topics[0].error_message.startswith("No active controller answered within 0.5 s")


# ---- lenient decoding: unknown tagged fields are ignored, as Kafka does ---------------------------

TAG = bytes([1, 9, 3, 0xAA, 0xBB, 0xCC])  # one tagged field: tag 9, 3 bytes


def test_unknown_tagged_fields_are_skipped_at_every_level() -> None:
    """CreateTopics v7 with a tagged field in a config, in the topic and in the request itself."""
    cls = load_request_schema(19, 7)
    values = {
        "topics": [
            {
                "name": "t",
                "num_partitions": 2,
                "replication_factor": 1,
                "assignments": [{"partition_index": 0, "broker_ids": [101]}],
                "configs": [{"name": "retention.ms", "value": "5"}, {"name": "x", "value": None}],
            }
        ],
        "timeout": timedelta(seconds=3),
        "validate_only": True,
    }
    buf = io.BytesIO()
    entity_writer(cls)(buf, build_entity(cls, values))
    plain = buf.getvalue()
    # Each entity ends with its tag count (0). The body ends with config "x" (name, null value,
    # tags), the topic's tags, timeout 3000, validate_only, the request's tags.
    assert plain.endswith(b"\x02x\x00\x00" + b"\x00" + b"\x00\x00\x0b\xb8\x01\x00")
    tagged = plain[:-8] + TAG + TAG + b"\x00\x00\x0b\xb8\x01" + TAG
    header = RequestHeader(19, 7, 1, "t")
    with pytest.raises(KeyError):
        entity_reader(cls)(tagged, 0)  # kio alone refuses
    assert decode_request(header, Reader(tagged + b"trailing")) == decode_request(
        header, Reader(plain)
    )
    assert strip_tagged_fields(cls, tagged, 0) == plain


@pytest.mark.parametrize("api_key", sorted(RANGES))
def test_every_flexible_version_can_be_stripped(api_key: int) -> None:
    """The schema walk knows every field type of every served flexible request version."""
    samples = {
        19: {
            "topics": [
                {
                    "name": "t",
                    "num_partitions": 1,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [],
                }
            ],
            "timeout": timedelta(0),
            "validate_only": False,
        },
        20: {
            "topics": [{"name": "t", "topic_id": uuid.uuid4()}],
            "topic_names": ["t"],
            "timeout": timedelta(0),
        },
        32: {
            "resources": [{"resource_type": 2, "resource_name": "t", "configuration_keys": ["a"]}],
            "include_synonyms": False,
            "include_documentation": False,
        },
        37: {
            "topics": [{"name": "t", "count": 2, "assignments": [{"broker_ids": [1]}]}],
            "timeout": timedelta(0),
            "validate_only": False,
        },
        43: {
            "election_type": 0,
            "topic_partitions": [{"topic": "t", "partitions": [0]}],
            "timeout": timedelta(0),
        },
        44: {
            "resources": [
                {
                    "resource_type": 2,
                    "resource_name": "t",
                    "configs": [{"name": "a", "config_operation": 0, "value": "1"}],
                }
            ],
            "validate_only": False,
        },
        33: {
            "resources": [
                {
                    "resource_type": 2,
                    "resource_name": "t",
                    "configs": [{"name": "a", "value": "1"}],
                }
            ],
            "validate_only": False,
        },
        60: {
            "include_cluster_authorized_operations": False,
            "endpoint_type": 1,
            "include_fenced_brokers": True,
        },
    }
    for version in versions(api_key):
        cls = load_request_schema(api_key, version)
        if not cls.__flexible__:
            continue
        buf = io.BytesIO()
        entity_writer(cls)(buf, build_entity(cls, samples[api_key]))
        plain = buf.getvalue()
        tagged = plain[:-1] + TAG  # the request's own tagged fields
        decoded = decode_request(RequestHeader(api_key, version, 1, "t"), Reader(tagged))
        assert decoded == entity_reader(cls)(plain, 0)[0]
