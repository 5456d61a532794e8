"""Pure translations between Kafka admin requests/responses (kio entities, any version) and the
controller RPC bodies of ``kraft/rpc/apis.py``.

``*_body(request)`` turns a decoded Kafka request into a controller request body plus the items
refused locally (before anything is forwarded); ``*_values(...)`` turns the controller's answer
into a dict of response values for :func:`broker.protocol.kafka_codec.build`, keeping the request's item
order. A forwarding failure (``KraftError``) becomes every item's error via ``failed``.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode as KafkaError

from kraft.controller.configs import config_defs
from kraft.errors import KraftError
from kraft.records import RESOURCE_BROKER, RESOURCE_TOPIC

NO_ID = uuid.UUID(int=0)
NO_THROTTLE = timedelta(0)
RESOURCE_NAMES = {RESOURCE_TOPIC: "topic", RESOURCE_BROKER: "broker"}
ALTER_OPS = {0: "SET", 1: "DELETE", 2: "APPEND", 3: "SUBTRACT"}
ELECTION_TYPES = {0: "preferred", 1: "unclean"}
# Kafka's DescribeConfigs ConfigSource and ConfigType ids
SOURCE_DYNAMIC_TOPIC, SOURCE_DYNAMIC_BROKER, SOURCE_DYNAMIC_DEFAULT_BROKER, SOURCE_DEFAULT = (
    1,
    2,
    3,
    5,
)
CONFIG_TYPES = {"boolean": 1, "string": 2, "int": 3, "long": 5, "double": 6, "list": 7}
CLUSTER_OPERATIONS_OMITTED = -(2**31)


def kafka_error(code: int) -> KafkaError:
    """kio's error code for a controller error code (codes are Kafka's; unknown → -1)."""
    try:
        return KafkaError(int(code))
    except ValueError:
        return KafkaError.unknown_server_error


def error_of(item: Mapping[str, Any]) -> tuple[KafkaError, str | None]:
    """(error code, message or None) of a controller response item."""
    code = kafka_error(item.get("error_code", 0))
    message = item.get("error_message") or None
    return code, (None if code == KafkaError.none else message)


def failed(error: KraftError) -> dict[str, Any]:
    """A controller item standing for a forwarding failure."""
    return {"error_code": int(error.code), "error_message": error.message or error.code.name}


def _local_error(code: KafkaError, message: str) -> dict[str, Any]:
    return {"error_code": int(code), "error_message": message}


def _duplicates(names: Iterable[Any]) -> set[Any]:
    return {n for n, c in Counter(names).items() if c > 1}


# ---- CreateTopics --------------------------------------------------------------------------


def create_topics_body(req: Any) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """CreateTopics → controller body; also {request index: local error item}."""
    topics, refused = [], {}
    for i, t in enumerate(req.topics):
        keys = [c.name for c in t.configs]
        repeated = sorted(_duplicates(keys))
        if repeated:
            refused[i] = _local_error(
                KafkaError.invalid_config,
                f"Config(s) {', '.join(repeated)} given more than once for topic '{t.name}'.",
            )
            continue
        nulls = [c.name for c in t.configs if c.value is None]
        if nulls:
            refused[i] = _local_error(
                KafkaError.invalid_config,
                f"Null value not supported for topic configs: {', '.join(nulls)}",
            )
            continue
        item: dict[str, Any] = {
            "name": t.name,
            "num_partitions": int(t.num_partitions),
            "replication_factor": int(t.replication_factor),
        }
        if t.assignments:
            item["assignments"] = {
                int(a.partition_index): [int(b) for b in a.broker_ids] for a in t.assignments
            }
        if t.configs:
            item["configs"] = {c.name: c.value for c in t.configs}
        topics.append(item)
    return {"topics": topics, "validate_only": bool(getattr(req, "validate_only", False))}, refused


def create_topics_values(
    req: Any,
    results: list[dict[str, Any]],
    refused: Mapping[int, dict[str, Any]],
    configs: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Controller CreateTopics results (one per forwarded topic, in order) → response values.
    ``configs`` maps a created topic to its controller DescribeConfigs item (v5+ responses
    carry the new topic's configs; a failed describe sets ``topic_config_error_code``)."""
    forwarded = iter(results)
    out = []
    for i, t in enumerate(req.topics):
        item = refused.get(i) or next(forwarded, {}) or failed_missing()
        code, message = error_of(item)
        ok = code == KafkaError.none
        topic_id = item.get("topic_id") if ok else None
        described = (configs or {}).get(t.name) if ok else None
        config_code = error_of(described)[0] if described is not None else KafkaError.none
        entries = None
        if described is not None and config_code == KafkaError.none:
            entries = [
                {
                    "name": c["name"],
                    "value": c["value"],
                    "read_only": c["read_only"],
                    "config_source": c["config_source"],
                    "is_sensitive": c["is_sensitive"],
                }
                for c in config_entries(
                    RESOURCE_TOPIC, t.name, described.get("configs", []), None, False, False
                )
            ]
        out.append(
            {
                "name": t.name,
                "topic_id": uuid.UUID(topic_id) if topic_id else NO_ID,
                "error_code": code,
                "error_message": message,
                "topic_config_error_code": int(config_code),
                "num_partitions": int(item.get("num_partitions", -1)) if ok else -1,
                "replication_factor": int(item.get("replication_factor", -1)) if ok else -1,
                "configs": entries,
            }
        )
    return {"throttle_time": NO_THROTTLE, "topics": out}


def failed_missing() -> dict[str, Any]:
    """An item for a request entry the controller's answer did not cover."""
    return _local_error(
        KafkaError.unknown_server_error, "The controller did not answer for this item."
    )


# ---- DeleteTopics --------------------------------------------------------------------------


def delete_topic_names(
    req: Any, name_of_id: Mapping[str, str]
) -> list[tuple[str | None, uuid.UUID | None]]:
    """(name, topic id) per requested topic: v0–5 send names, v6 names or ids; an id is
    resolved to its name through ``name_of_id`` (None when unknown)."""
    if hasattr(req, "topic_names"):
        return [(n, None) for n in req.topic_names]
    out: list[tuple[str | None, uuid.UUID | None]] = []
    for t in req.topics:
        topic_id = t.topic_id if t.topic_id is not None and t.topic_id != NO_ID else None
        name = t.name if t.name else (name_of_id.get(str(topic_id)) if topic_id else None)
        out.append((name, topic_id))
    return out


def delete_topics_values(
    requested: list[tuple[str | None, uuid.UUID | None]], results: list[dict[str, Any]]
) -> dict[str, Any]:
    """Controller DeleteTopics results (one per named topic, in order) → response values."""
    forwarded = iter(results)
    out = []
    for name, topic_id in requested:
        if name is None:
            item = _local_error(
                KafkaError.unknown_topic_id,
                f"Topic id {topic_id} does not exist."
                if topic_id
                else "A topic needs a name or an id.",
            )
        else:
            item = next(forwarded, {}) or failed_missing()
        code, message = error_of(item)
        tid = item.get("topic_id")
        out.append(
            {
                "name": name,
                "topic_id": uuid.UUID(tid) if tid else (topic_id or NO_ID),
                "error_code": code,
                "error_message": message,
            }
        )
    return {"throttle_time": NO_THROTTLE, "responses": out}


# ---- CreatePartitions ----------------------------------------------------------------------


def create_partitions_body(req: Any) -> dict[str, Any]:
    topics = []
    for t in req.topics:
        item: dict[str, Any] = {"name": t.name, "count": int(t.count)}
        if t.assignments is not None:
            item["assignments"] = [[int(b) for b in a.broker_ids] for a in t.assignments]
        topics.append(item)
    return {"topics": topics, "validate_only": bool(req.validate_only)}


def create_partitions_values(req: Any, results: list[dict[str, Any]]) -> dict[str, Any]:
    forwarded = iter(results)
    out = []
    for t in req.topics:
        code, message = error_of(next(forwarded, {}) or failed_missing())
        out.append({"name": t.name, "error_code": code, "error_message": message})
    return {"throttle_time": NO_THROTTLE, "results": out}


# ---- configs -------------------------------------------------------------------------------


def resource_type_name(resource_type: int) -> str | None:
    """'topic' / 'broker' for Kafka's resource type id; None for types pykraft does not keep."""
    return RESOURCE_NAMES.get(int(resource_type))


def _unsupported_resource(resource_type: int) -> dict[str, Any]:
    return _local_error(
        KafkaError.invalid_request,
        f"Resource type {resource_type} is not supported (only topics (2) and brokers (4)).",
    )


def describe_configs_body(req: Any) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """DescribeConfigs → controller body; unsupported resource types are refused locally."""
    resources, refused = [], {}
    for i, r in enumerate(req.resources):
        rtype = resource_type_name(r.resource_type)
        if rtype is None:
            refused[i] = _unsupported_resource(r.resource_type)
        else:
            resources.append({"resource_type": rtype, "resource_name": r.resource_name})
    return {"resources": resources}, refused


def _source(resource_type: int, resource_name: str, source: str) -> int:
    if source != "dynamic":
        return SOURCE_DEFAULT
    if resource_type == RESOURCE_TOPIC:
        return SOURCE_DYNAMIC_TOPIC
    return SOURCE_DYNAMIC_DEFAULT_BROKER if resource_name == "" else SOURCE_DYNAMIC_BROKER


def config_entries(
    resource_type: int,
    resource_name: str,
    configs: list[dict[str, Any]],
    keys: tuple[str, ...] | None,
    synonyms: bool,
    documentation: bool,
) -> list[dict[str, Any]]:
    """Controller config entries → DescribeConfigs entries (filtered to ``keys`` if given)."""
    defs = config_defs(resource_type)
    out = []
    for c in configs:
        name = c["name"]
        if keys is not None and name not in keys:
            continue
        source = _source(resource_type, resource_name, c.get("source", "default"))
        d = defs.get(name)
        out.append(
            {
                "name": name,
                "value": c.get("value"),
                "read_only": bool(c.get("read_only")),
                "is_default": source == SOURCE_DEFAULT,
                "config_source": source,
                "is_sensitive": bool(c.get("sensitive")),
                "synonyms": [{"name": name, "value": c.get("value"), "source": source}]
                if synonyms
                else [],
                "config_type": CONFIG_TYPES.get(d.type, 0) if d else 0,
                "documentation": (d.doc or None) if documentation and d else None,
            }
        )
    return out


def describe_configs_values(
    req: Any, results: list[dict[str, Any]], refused: Mapping[int, dict[str, Any]]
) -> dict[str, Any]:
    forwarded = iter(results)
    synonyms = bool(getattr(req, "include_synonyms", False))
    documentation = bool(getattr(req, "include_documentation", False))
    out = []
    for i, r in enumerate(req.resources):
        item = refused.get(i) or next(forwarded, {}) or failed_missing()
        code, message = error_of(item)
        configs = []
        if code == KafkaError.none:
            keys = (
                tuple(r.configuration_keys) if r.configuration_keys else None
            )  # empty = all, as Kafka
            configs = config_entries(
                int(r.resource_type),
                r.resource_name,
                item.get("configs", []),
                keys,
                synonyms,
                documentation,
            )
        out.append(
            {
                "error_code": code,
                "error_message": message,
                "resource_type": r.resource_type,
                "resource_name": r.resource_name,
                "configs": configs,
            }
        )
    return {"throttle_time": NO_THROTTLE, "results": out}


def incremental_alter_configs_body(req: Any) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """IncrementalAlterConfigs → controller body; an unknown op is passed on by number so the
    controller names it in its INVALID_REQUEST."""
    resources, refused = [], {}
    for i, r in enumerate(req.resources):
        rtype = resource_type_name(r.resource_type)
        if rtype is None:
            refused[i] = _unsupported_resource(r.resource_type)
            continue
        ops = []
        for c in r.configs:
            op: dict[str, Any] = {
                "name": c.name,
                "op": ALTER_OPS.get(int(c.config_operation), str(c.config_operation)),
            }
            if c.value is not None:
                op["value"] = c.value
            ops.append(op)
        resources.append({"resource_type": rtype, "resource_name": r.resource_name, "ops": ops})
    return {"resources": resources, "validate_only": bool(req.validate_only)}, refused


def legacy_alter_configs_body(req: Any) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """AlterConfigs (legacy, whole set replaced) → controller body: one SET per given key (a
    null value is left out, so the key ends up deleted)."""
    resources, refused = [], {}
    for i, r in enumerate(req.resources):
        rtype = resource_type_name(r.resource_type)
        if rtype is None:
            refused[i] = _unsupported_resource(r.resource_type)
            continue
        ops = [
            {"name": c.name, "op": "SET", "value": c.value}
            for c in r.configs
            if c.value is not None
        ]
        resources.append({"resource_type": rtype, "resource_name": r.resource_name, "ops": ops})
    return {"resources": resources, "validate_only": bool(req.validate_only)}, refused


def alter_configs_values(
    req: Any, results: list[dict[str, Any]], refused: Mapping[int, dict[str, Any]]
) -> dict[str, Any]:
    forwarded = iter(results)
    out = []
    for i, r in enumerate(req.resources):
        code, message = error_of(refused.get(i) or next(forwarded, {}) or failed_missing())
        out.append(
            {
                "error_code": code,
                "error_message": message,
                "resource_type": r.resource_type,
                "resource_name": r.resource_name,
            }
        )
    return {"throttle_time": NO_THROTTLE, "responses": out}


# ---- ElectLeaders --------------------------------------------------------------------------


def elect_leaders_body(req: Any) -> dict[str, Any] | KafkaError:
    """ElectLeaders → controller body, or INVALID_REQUEST for an unknown election type."""
    election_type = ELECTION_TYPES.get(int(getattr(req, "election_type", 0)))
    if election_type is None:
        return KafkaError.invalid_request
    partitions = None
    if req.topic_partitions is not None:
        partitions = [
            {"topic": tp.topic, "partition": int(p)}
            for tp in req.topic_partitions
            for p in tp.partitions
        ]
    return {"election_type": election_type, "partitions": partitions}


def elect_leaders_values(
    results: list[dict[str, Any]], error: KafkaError = KafkaError.none, message: str | None = None
) -> dict[str, Any]:
    """Controller ElectLeaders results → response values, grouped by topic in first-seen order."""
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for item in results:
        code, msg = error_of(item)
        by_topic.setdefault(item.get("topic", ""), []).append(
            {
                "partition_id": int(item.get("partition", -1)),
                "error_code": code,
                "error_message": msg,
            }
        )
    return {
        "throttle_time": NO_THROTTLE,
        "error_code": error,
        "error_message": message,
        "replica_election_results": [
            {"topic": t, "partition_result": p} for t, p in by_topic.items()
        ],
    }


def elect_leaders_failed(req: Any, item: dict[str, Any]) -> list[dict[str, Any]]:
    """The same error for every listed partition (a forwarding failure)."""
    if req.topic_partitions is None:
        return []
    return [
        {"topic": tp.topic, "partition": int(p), **item}
        for tp in req.topic_partitions
        for p in tp.partitions
    ]


# ---- DescribeCluster -----------------------------------------------------------------------


def describe_cluster_values(
    image: Any, cluster_id: str, listener_name: str, endpoint_type: int, include_fenced: bool
) -> dict[str, Any]:
    """DescribeCluster from a metadata image: brokers with this listener's endpoint (unfenced
    ones, plus fenced ones if asked); the "controller" is the lowest unfenced broker, as in
    Metadata responses (clients cannot reach KRaft controllers)."""
    values: dict[str, Any] = {
        "throttle_time": NO_THROTTLE,
        "error_code": KafkaError.none,
        "error_message": None,
        "endpoint_type": endpoint_type,
        "cluster_id": cluster_id,
        "controller_id": -1,
        "brokers": [],
        "cluster_authorized_operations": CLUSTER_OPERATIONS_OMITTED,
    }
    if endpoint_type != 1:
        values.update(
            error_code=KafkaError.unsupported_endpoint_type,
            error_message="The broker only serves broker endpoints (endpoint_type 1).",
        )
        return values
    brokers = []
    for bid in sorted(image.brokers if image is not None else ()):
        reg = image.brokers[bid]
        if reg.fenced and not include_fenced:
            continue
        ep = next((e for e in reg.endpoints if e["name"] == listener_name), None)
        if ep is not None:
            brokers.append(
                {
                    "broker_id": bid,
                    "host": ep["host"],
                    "port": ep["port"],
                    "rack": reg.rack,
                    "is_fenced": reg.fenced,
                }
            )
    unfenced = [b["broker_id"] for b in brokers if not b["is_fenced"]]
    values.update(brokers=brokers, controller_id=min(unfenced) if unfenced else -1)
    return values
