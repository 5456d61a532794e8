"""Typed controller RPC bodies: the check at the dispatch, old-form bodies, error responses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from kraft.config import ControllerConfig
from kraft.controller_apis import ControllerApis
from kraft.controller_server import ControllerServer, not_controller
from kraft.errors import ErrorCode, KraftError
from kraft.rpc.apis import APIS
from kraft.rpc.bodies import (
    REQUESTS,
    RESPONSES,
    CreateTopicsRequest,
    FetchMetadataResponse,
    decode_request,
    encode_response,
)
from kraft.rpc.framing import Packed, decode_payload
from kraft.rpc.server import RequestContext

CTX = RequestContext(peer="127.0.0.1:1", principal="User:ANONYMOUS", client_id="old-cli")


@pytest.fixture
def server(tmp_path: Path) -> ControllerServer:
    config = ControllerConfig.from_properties(
        {
            "node.id": "1",
            "process.roles": "controller",
            "cluster.id": "c",
            "controller.quorum.voters": "1@127.0.0.1:9000",
            "controller.quorum.raft.voters": "1@127.0.0.1:9001",
            "metadata.log.dir": str(tmp_path),
        },
        env={"KRAFT_RAFT_SECRET": "a-test-raft-secret-of-at-least-32-bytes"},
    )
    node = ControllerServer(config)
    yield node
    node.log.close()


def test_every_api_has_a_request_and_a_response_type() -> None:
    assert set(REQUESTS) == set(APIS) == set(RESPONSES)


@pytest.mark.parametrize(
    "api, body, where",
    [
        ("CreateTopics", {}, "missing required field `topics`"),
        ("CreateTopics", {"topics": "x"}, "at `topics`"),
        ("CreateTopics", {"topics": [5]}, "at `topics[0]`"),
        ("CreateTopics", {"topics": [{"name": "t", "num_partitions": "3"}]}, "topics[0]"),
        ("CreateTopics", {"topics": [{"name": "t", "assignments": {"x": [0]}}]}, "assignments"),
        ("DescribeConfigs", {}, "missing required field `resources`"),
        ("BrokerHeartbeat", {"broker_id": 1, "broker_epoch": 2}, "metadata_offset"),
        ("AlterPartition", {"broker_id": 1, "broker_epoch": 2, "topics": [{}]}, "topics[0]"),
        ("FetchMetadata", {"from_offset": True}, "at `from_offset`"),  # a bool is not an int
        (
            "BrokerRegistration",
            {"broker_id": 1, "cluster_id": "c", "incarnation_id": "i", "listeners": [{"h": 1}]},
            "listeners[0]",
        ),
    ],
)
def test_a_body_that_does_not_fit_is_invalid_request_naming_the_field(
    api: str, body: dict[str, Any], where: str
) -> None:
    with pytest.raises(KraftError) as e:
        decode_request(api, body)
    assert e.value.code == ErrorCode.INVALID_REQUEST
    assert e.value.message.startswith(f"{api}: ") and where in e.value.message
    assert "$" not in e.value.message


def test_unknown_fields_are_tolerated_and_optional_fields_keep_their_defaults() -> None:
    req = decode_request("CreateTopics", {"topics": [{"name": "t", "new_field": 1}], "x": 2})
    assert isinstance(req, CreateTopicsRequest)
    (topic,) = req.topics
    assert (topic.name, topic.num_partitions, topic.assignments, topic.configs) == (
        "t",
        None,
        None,
        None,
    )
    assert req.validate_only is None and req.auto_create is None


def test_the_dispatch_checks_the_body_before_the_handler_runs(server: ControllerServer) -> None:
    apis = server.apis
    seen: list[tuple[Any, dict[str, Any]]] = []

    async def recorder(req: Any, wire: dict[str, Any], ctx: Any) -> dict[str, Any]:
        seen.append((req, wire))
        return {"ok": True}

    apis.handlers["CreateTopics"] = recorder
    with pytest.raises(KraftError) as e:
        trio.run(apis.handle, "CreateTopics", {"topics": [{"name": 7}]}, CTX)
    assert e.value.code == ErrorCode.INVALID_REQUEST and "topics[0].name" in e.value.message
    assert seen == []


def test_an_old_form_body_reaches_its_handler(
    server: ControllerServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    apis = server.apis
    seen: list[tuple[Any, dict[str, Any]]] = []

    async def recorder(req: Any, wire: dict[str, Any], ctx: Any) -> dict[str, Any]:
        seen.append((req, wire))
        return {"ok": True}

    monkeypatch.setattr(ControllerServer, "is_active", property(lambda self: True))
    apis.handlers["CreateTopics"] = recorder
    # an old-form body, as today's clients send it: a plain map, optional fields absent
    old_form = {"topics": [{"name": "t", "num_partitions": 3, "replication_factor": 1}]}
    assert trio.run(apis.handle, "CreateTopics", old_form, CTX) == {"ok": True}
    ((req, wire),) = seen
    assert wire is old_form  # the pure handler gets the map as sent
    assert req.topics[0].num_partitions == 3 and req.topics[0].configs is None


def test_real_handlers_answer_old_form_bodies(server: ControllerServer) -> None:
    node = trio.run(server.apis.handle, "DescribeNode", {"checksum": False, "extra": 1}, CTX)
    assert node["node_id"] == 1 and node["image_checksum"] is None and node["hashes"] == []
    assert node["is_active"] is False
    fetched = trio.run(server.apis.handle, "FetchMetadata", {"from_offset": 0}, CTX)
    assert isinstance(fetched, Packed)  # encoded once for every broker fetching the same
    assert decode_payload(fetched.payload) == {"batches": [], "high_watermark": 0, "snapshot": None}
    read = trio.run(server.apis.handle, "ListTopics", {}, CTX)
    assert read == {"offset": -1, "topics": []}
    with pytest.raises(KraftError) as e:  # a write on a controller that is not active
        trio.run(server.apis.handle, "CreateTopics", {"topics": [{"name": "t"}]}, CTX)
    assert e.value.code == ErrorCode.NOT_CONTROLLER
    with pytest.raises(KraftError) as e:
        trio.run(server.apis.handle, "FenceBroker", {"broker_id": 1, "broker_epoch": 2}, CTX)
    assert e.value.code == ErrorCode.INVALID_REQUEST and "reason" in e.value.message
    body = {"broker_id": 1, "broker_epoch": 2, "reason": "x"}
    with pytest.raises(KraftError) as e:
        trio.run(server.apis.handle, "FenceBroker", body, CTX)
    assert e.value.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED


def test_every_api_is_in_the_dispatch_table(server: ControllerServer) -> None:
    assert isinstance(server.apis, ControllerApis)
    assert set(server.apis.handlers) == set(APIS)
    with pytest.raises(KraftError) as e:
        trio.run(server.apis.handle, "NoSuchApi", {}, CTX)
    assert e.value.code == ErrorCode.UNSUPPORTED_VERSION


def test_response_structs_encode_to_the_wire_maps() -> None:
    out = encode_response(FetchMetadataResponse(batches=[b"\x01"], high_watermark=3, snapshot=None))
    assert out == {"batches": [b"\x01"], "high_watermark": 3, "snapshot": None}


def test_error_responses_keep_their_wire_shape() -> None:
    assert KraftError(ErrorCode.INVALID_REQUEST, "bad").to_response() == {
        "error_code": 42,
        "error_message": "bad",
        "body": {},
    }
    err = not_controller((2, "h", 9))
    assert err.body == {"leader_id": 2, "leader_host": "h", "leader_port": 9}
    assert err.to_response() == {
        "error_code": 41,
        "error_message": "this controller is not active",
        "body": {"leader_id": 2, "leader_host": "h", "leader_port": 9},
    }
    assert not_controller(None).body == {"leader_id": -1, "leader_host": "", "leader_port": 0}


def test_the_state_machine_answers_fit_the_response_types() -> None:
    """The response structs describe what the write and read handlers answer (success, per-item
    errors and a duplicate), and every request the test sends fits its request struct."""
    import msgspec

    from tests.unit.test_state_machine import Harness

    h = Harness(brokers=3)
    answers: list[tuple[str, dict[str, Any]]] = []

    def send(api: str, body: dict[str, Any], request_id: str | None = None) -> dict[str, Any]:
        decode_request(api, body)
        if APIS[api].kind == "read":
            response = h.sm.read(api, body)
        else:
            response = h.write(api, body, request_id=request_id)[1]
        answers.append((api, response))
        return response

    topics = [{"name": "t", "num_partitions": 2, "replication_factor": 2}, {"name": "bad/"}]
    send("CreateTopics", {"topics": topics}, request_id="again")
    send("CreateTopics", {"topics": topics}, request_id="again")  # a duplicate
    send("CreatePartitions", {"topics": [{"name": "t", "count": 3}, {"name": "x", "count": 2}]})
    ops = [{"name": "retention.ms", "op": "SET", "value": "5"}]
    resources = [{"resource_type": "topic", "resource_name": "t", "ops": ops}]
    send("IncrementalAlterConfigs", {"resources": resources})
    send("AlterConfigs", {"resources": resources})
    send("ElectLeaders", {"election_type": "preferred", "partitions": None})
    part = h.part("t", 0)
    leader = part.leader
    change = {
        "partition": 0,
        "leader_epoch": part.leader_epoch,
        "partition_epoch": part.partition_epoch,
        "isr": [leader],
    }
    send(
        "AlterPartition",
        {
            "broker_id": leader,
            "broker_epoch": h.epoch(leader),
            "topics": [{"topic_id": h.image.topic("t").topic_id, "partitions": [change]}],
        },
    )
    send("AllocateProducerIds", {"broker_id": 0, "broker_epoch": h.epoch(0)})
    send("DeleteTopics", {"names": ["t", "missing"]})
    send("NoOp", {})
    send("ListTopics", {})
    send("DescribeTopics", {"names": ["missing"]})
    send("DescribeConfigs", {"resources": [{"resource_type": "broker", "resource_name": ""}]})
    send("DescribeCluster", {})
    for api, response in answers:
        msgspec.convert(response, RESPONSES[api])  # raises naming the field that does not fit
    assert answers[1][1]["duplicate"] is True


def test_describe_cluster_names_divergent_brokers_on_the_active_controller_only(
    server: ControllerServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kraft.metadata.image_check import Mismatch

    standby = trio.run(server.apis.handle, "DescribeCluster", {}, CTX)
    assert "divergent_brokers" not in standby and standby["brokers"] == []
    with pytest.raises(KraftError) as e:
        trio.run(server.apis.handle, "DescribeCluster", {"active_only": True}, CTX)
    assert e.value.code == ErrorCode.NOT_CONTROLLER
    monkeypatch.setattr(ControllerServer, "is_active", property(lambda self: True))
    server.lifecycle.images.note(101, Mismatch(4, "b" * 64, "a" * 64, 1, fenced=True))
    active = trio.run(server.apis.handle, "DescribeCluster", {"active_only": True}, CTX)
    assert active["divergent_brokers"] == [101]
    msgspec.convert(active, RESPONSES["DescribeCluster"])


def test_fetch_metadata_states_no_checksum_where_the_fetcher_will_not_be(
    server: ControllerServer,
) -> None:
    body = {"from_offset": 0, "image_checksum": True}
    fetched = trio.run(server.apis.handle, "FetchMetadata", body, CTX)
    assert isinstance(fetched, Packed)  # no checksum stated: the shared encoding
    assert decode_payload(fetched.payload) == {"batches": [], "high_watermark": 0, "snapshot": None}


def test_fetch_answers_share_one_encoding_until_the_batches_differ(
    server: ControllerServer,
) -> None:
    apis = server.apis
    first = apis._packed_batches([b"x" * 10], 5)
    assert apis._packed_batches([b"x" * 10], 5) is first  # every broker woken by one commit
    other = apis._packed_batches([b"y" * 10], 5)  # the same offsets rewritten: not reused
    assert other is not first and decode_payload(other.payload)["batches"] == [b"y" * 10]
    later = apis._packed_batches([b"y" * 10], 6)
    assert later is not other and decode_payload(later.payload)["high_watermark"] == 6
