"""Kafka admin clients against real brokers: 3 controllers + 3 brokers on loopback; kafka-python's
KafkaAdminClient and confluent-kafka's AdminClient create, describe, alter, grow, elect and delete
topics through brokers, which forward to the active controller; ``kraft topics describe --json``
and the metadata log (with the Kafka client's id and principal in the provenance) agree. The
cluster has RPC authentication (the default), so clients log in over SASL/PLAIN: brokers refuse
to forward an anonymous client's admin request (tests/integration/test_secure_defaults.py)."""

from __future__ import annotations

import io
import json
import socket
import struct
from datetime import timedelta

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from broker.protocol.kafka_codec import build
from kraft.rpc.auth import hash_password
from tests.harness import LocalCluster, kraft, kraft_json, poll

pytestmark = pytest.mark.integration

USER, PASSWORD = "alice", "alice-secret"
kafka_admin = pytest.importorskip("kafka.admin")
confluent_admin = pytest.importorskip("confluent_kafka.admin")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kafka-admin")
    c = LocalCluster(tmp / "cluster")
    c.up(3, 3, "--fsync", "never")  # returns once every broker is unfenced
    try:
        users = tmp / "kafka-users"
        users.write_text(f"{USER}:{hash_password(PASSWORD, iterations=1000)}\n")
        for broker_id in (101, 102, 103):
            c.use_sasl_listener(broker_id, users)
        yield c
    finally:
        c.down()


def broker_address(cluster: LocalCluster, broker_id: int) -> str:
    b = next(b for b in cluster.meta["brokers"] if b["id"] == broker_id)
    return f"{b['host']}:{b['port']}"


def describe_topic(cluster: LocalCluster, name: str) -> dict:
    topics = kraft_json("topics", "describe", name, "--cluster", str(cluster.dir))["topics"]
    return topics[0]


def topic_names(cluster: LocalCluster) -> set[str]:
    return {
        t["name"] for t in kraft_json("topics", "list", "--cluster", str(cluster.dir))["topics"]
    }


def provenance_of(cluster: LocalCluster, api: str) -> list[dict]:
    """Provenance of every record written by ``api``, from controller 1's log."""
    path = cluster.controller(1)["metadata_dir"]
    items = [json.loads(line) for line in kraft("log", "dump", path, "--json").stdout.splitlines()]
    return [
        i["provenance"] for i in items if i["kind"] == "record" and i["provenance"]["api"] == api
    ]


# ---- kafka-python --------------------------------------------------------------------------


def test_kafka_python_admin_client(cluster):
    from kafka.admin import ConfigResource, ConfigResourceType, NewPartitions
    from kafka.errors import InvalidTopicError, TopicAlreadyExistsError

    admin = kafka_admin.KafkaAdminClient(
        bootstrap_servers=broker_address(cluster, 102),
        client_id="kp-admin",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username=USER,
        sasl_plain_password=PASSWORD,
        request_timeout_ms=30000,
    )
    try:
        created = admin.create_topics(
            {
                "kp-orders": {
                    "num_partitions": 3,
                    "replication_factor": 2,
                    "configs": {"retention.ms": "3600000"},
                }
            }
        )["topics"][0]
        assert (
            created["configs"]["retention.ms"]["value"] == "3600000"
        )  # v5+: the new topic's configs
        assert created["configs"]["segment.ms"]["config_source"] == "DEFAULT_CONFIG"
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics({"kp-orders": {"num_partitions": 1, "replication_factor": 1}})
        bad = admin.create_topics(
            {"bad name!": {"num_partitions": 1, "replication_factor": 1}}, raise_errors=False
        )["topics"][0]
        assert bad["error_code"] == InvalidTopicError.errno and "bad name!" in bad["error_message"]
        checked = admin.create_topics(
            {"kp-validate": {"num_partitions": 2, "replication_factor": 1}}, validate_only=True
        )["topics"][0]
        assert checked["error_code"] == 0

        # Reads may reach a controller that has not applied the write yet (as Kafka's brokers'
        # metadata may lag): poll them.
        topic = ConfigResource(ConfigResourceType.TOPIC, "kp-orders")
        configs = poll(
            lambda: admin.describe_configs([topic])["topic"]["kp-orders"], 30, what="configs"
        )
        assert configs["retention.ms"]["value"] == "3600000"
        assert configs["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        admin.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC, "kp-orders", configs={"cleanup.policy": "compact"}
                )
            ]
        )
        everything = poll(
            lambda: (
                (c := admin.describe_configs([topic], config_filter="all")["topic"]["kp-orders"])
                and c["cleanup.policy"]["value"] == "compact"
                and c
            ),
            30,
            what="altered configs",
        )
        assert everything["segment.ms"]["config_source"] == "DEFAULT_CONFIG"
        broker = admin.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, "101")], config_filter="all"
        )["broker"]["101"]
        assert broker["min.insync.replicas"]["config_source"] == "DEFAULT_CONFIG"

        admin.create_partitions({"kp-orders": NewPartitions(total_count=4)})
        admin.elect_leaders(0, {"kp-orders": [0, 1]})  # preferred leaders already lead: not needed

        described = poll(
            lambda: (
                (d := describe_topic(cluster, "kp-orders"))
                and len(d["partitions"]) == 4
                and d["configs"].get("cleanup.policy")
                and d
            ),
            30,
            what="kraft topics describe",
        )
        assert all(len(p["replicas"]) == 2 for p in described["partitions"])
        assert described["configs"] == {"cleanup.policy": "compact", "retention.ms": "3600000"}

        info = admin.describe_cluster()
        assert sorted(b["broker_id"] for b in info["brokers"]) == [101, 102, 103]
        assert info["cluster_id"] == cluster.meta["cluster_id"]

        poll(
            lambda: any(
                p["client_id"].startswith("kp-admin@broker-") and p["principal"] == f"User:{USER}"
                for p in provenance_of(cluster, "CreateTopics")
            ),
            30,
            what="the Kafka client's id in the metadata log",
        )

        admin.delete_topics(["kp-orders"])
        poll(
            lambda: not {"kp-orders", "kp-validate"} & set(admin.list_topics()),
            30,
            what="kp-orders gone",
        )
    finally:
        admin.close()


# ---- confluent-kafka -------------------------------------------------------------------------


def test_confluent_admin_client(cluster):
    from confluent_kafka import ElectionType, KafkaError, KafkaException, TopicPartition
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewPartitions,
        NewTopic,
    )

    admin = confluent_admin.AdminClient(
        {
            "bootstrap.servers": broker_address(cluster, 103),
            "client.id": "ck-admin",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": USER,
            "sasl.password": PASSWORD,
        }
    )

    def result(futures: dict):
        return {k: f.result(timeout=30) for k, f in futures.items()}

    result(admin.create_topics([NewTopic("ck-orders", 2, 3, config={"retention.ms": "7200000"})]))
    with pytest.raises(KafkaException) as bad:
        result(admin.create_topics([NewTopic("bad/name", 1, 1)]))
    assert bad.value.args[0].code() == KafkaError.TOPIC_EXCEPTION
    result(admin.create_topics([NewTopic("ck-validate", 1, 1)], validate_only=True))

    resource = ConfigResource(ConfigResource.Type.TOPIC, "ck-orders")
    configs = poll(lambda: result(admin.describe_configs([resource]))[resource], 30, what="configs")
    assert configs["retention.ms"].value == "7200000" and not configs["retention.ms"].is_default
    assert configs["segment.ms"].is_default
    change = ConfigResource(
        ConfigResource.Type.TOPIC,
        "ck-orders",
        incremental_configs=[
            ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
            ConfigEntry(
                "cleanup.policy", "delete,compact", incremental_operation=AlterConfigOpType.SET
            ),
        ],
    )
    result(admin.incremental_alter_configs([change]))
    bad_value = ConfigResource(
        ConfigResource.Type.TOPIC,
        "ck-orders",
        incremental_configs=[
            ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(KafkaException) as invalid:
        result(admin.incremental_alter_configs([bad_value]))
    assert invalid.value.args[0].code() == KafkaError.INVALID_CONFIG

    result(admin.create_partitions([NewPartitions("ck-orders", 3)]))
    elected = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition("ck-orders", 0)]).result(
        timeout=30
    )
    assert (
        elected[TopicPartition("ck-orders", 0)] is None
        or elected[TopicPartition("ck-orders", 0)].code() == KafkaError.ELECTION_NOT_NEEDED
    )

    described = poll(
        lambda: (
            (d := describe_topic(cluster, "ck-orders"))
            and len(d["partitions"]) == 3
            and "retention.ms" not in d["configs"]
            and d
        ),
        30,
        what="kraft topics describe",
    )
    assert described["configs"] == {"cleanup.policy": "delete,compact"}
    assert all(len(p["replicas"]) == 3 for p in described["partitions"])

    result(admin.delete_topics(["ck-orders"]))
    with pytest.raises(KafkaException) as gone:
        result(admin.delete_topics(["ck-orders"]))
    assert gone.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    poll(
        lambda: not {"ck-orders", "ck-validate"} & set(admin.list_topics(timeout=10).topics),
        30,
        what="ck-orders gone",
    )
    admin = None  # librdkafka stops its threads and connections now, not when the cluster is gone


# ---- any broker forwards ---------------------------------------------------------------------


def _exchange(s: socket.socket, api_key: int, version: int, body: bytes) -> bytes:
    """One non-flexible request (header v1) and its response body (after the correlation id)."""
    frame = struct.pack(">hhih", api_key, version, 3, 3) + b"raw" + body
    s.sendall(struct.pack(">i", len(frame)) + frame)
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
        chunk = s.recv(65536)
        assert chunk, "connection closed"
        data += chunk
    return data[8:]


def sasl_plain_login(s: socket.socket) -> None:
    """SaslHandshake v1 (PLAIN) then SaslAuthenticate v0 as USER."""
    assert struct.unpack(">h", _exchange(s, 17, 1, struct.pack(">h", 5) + b"PLAIN")[:2])[0] == 0
    token = b"\x00" + USER.encode() + b"\x00" + PASSWORD.encode()
    answer = _exchange(s, 36, 0, struct.pack(">i", len(token)) + token)
    assert struct.unpack(">h", answer[:2])[0] == 0, answer


def kafka_call(
    address: str, api_key: int, version: int, values: dict, client_id: str = "raw"
) -> object:
    """One request/response over a fresh socket (request header v1, or v2 for flexible versions)."""
    cls = load_request_schema(api_key, version)
    buf = io.BytesIO()
    entity_writer(cls)(buf, build(cls, values))
    cid = client_id.encode()
    tags = b"\x00" if cls.__flexible__ else b""
    frame = struct.pack(">hhih", api_key, version, 7, len(cid)) + cid + tags + buf.getvalue()
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        sasl_plain_login(s)
        s.sendall(struct.pack(">i", len(frame)) + frame)
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = s.recv(65536)
            assert chunk, "connection closed"
            data += chunk
    assert struct.unpack(">i", data[4:8])[0] == 7
    return entity_reader(load_response_schema(api_key, version))(
        data, 9 if cls.__flexible__ else 8
    )[0]


def test_every_broker_forwards_to_the_active_controller(cluster):
    for broker_id in (101, 102, 103):
        address, name = broker_address(cluster, broker_id), f"via-{broker_id}"
        resp = kafka_call(
            address,
            19,
            7,
            {
                "topics": [
                    {
                        "name": name,
                        "num_partitions": 2,
                        "replication_factor": 3,
                        "assignments": [],
                        "configs": [],
                    }
                ],
                "timeout": timedelta(seconds=20),
                "validate_only": False,
            },
        )
        created = resp.topics[0]
        assert (created.error_code, created.num_partitions, created.replication_factor) == (
            0,
            2,
            3,
        ), resp
        # DeleteTopics v6 (flexible) by topic id: the broker resolves the id from its image
        poll(
            lambda: (
                kafka_call(
                    address,
                    20,
                    6,
                    {
                        "topics": [{"name": None, "topic_id": created.topic_id}],
                        "timeout": timedelta(seconds=20),
                    },
                )
                .responses[0]
                .error_code
                == 0
            ),
            30,
            what=f"{name} deleted by id through broker {broker_id}",
        )
    poll(lambda: not any(n.startswith("via-") for n in topic_names(cluster)), 30, what="via-* gone")


def test_follows_a_new_active_controller(cluster):
    """Last in the module: it stops the active controller."""
    cluster.kill(cluster.active_controller())
    resp = kafka_call(
        broker_address(cluster, 102),
        19,
        7,
        {
            "topics": [
                {
                    "name": "after-failover",
                    "num_partitions": 1,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [],
                }
            ],
            "timeout": timedelta(seconds=30),
            "validate_only": False,
        },
    )
    assert resp.topics[0].error_code == 0, resp
