"""Every controller RPC API, its kind and the fields of its request and response bodies.

One place for the shapes the state machine, the controller node, the CLI and the broker share.
``validate_request`` checks a request body's top-level fields and types before it reaches any
handler, so malformed input is refused with ``INVALID_REQUEST`` and changes nothing.

Field notation: ``name: type`` where type is ``int``, ``str``, ``bool``, ``list``, ``map``,
``bytes`` or ``any``; a trailing ``?`` means optional (may be absent or null).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kraft.errors import ErrorCode, KraftError


@dataclass(frozen=True)
class Api:
    name: str
    kind: str  # "write" (replicated command), "read" (any controller), "node" (handled by the node)
    request: tuple[str, ...]
    response: tuple[str, ...]
    doc: str = ""


_APIS = [
    # ---- replicated writes ---------------------------------------------------------------
    Api(
        "CreateTopics",
        "write",
        ("topics: list", "validate_only: bool?", "auto_create: bool?"),
        ("topics: list",),
        "topics[]: {name: str, num_partitions: int? (-1 = num.partitions), replication_factor: "
        "int? (-1 = default.replication.factor), assignments: map? {partition: [broker ids]}, "
        "configs: map? {key: value}} -> topics[]: {name, topic_id, error_code, error_message, "
        "num_partitions, replication_factor}; auto_create: a broker creating topics for "
        "auto.create.topics.enable (reason auto-create)",
    ),
    Api(
        "CreatePartitions",
        "write",
        ("topics: list", "validate_only: bool?"),
        ("topics: list",),
        "topics[]: {name: str, count: int, assignments: list? [[broker ids] per new partition]} "
        "-> topics[]: {name, error_code, error_message}",
    ),
    Api(
        "DeleteTopics",
        "write",
        ("names: list",),
        ("topics: list",),
        "names[]: topic names -> topics[]: {name, topic_id, error_code, error_message}",
    ),
    Api(
        "AlterConfigs",
        "write",
        ("resources: list", "validate_only: bool?"),
        ("resources: list",),
        "legacy AlterConfigs: each resource's dynamic configs become exactly the given set; "
        "resources[]: {resource_type, resource_name, ops: [{name, op: 'SET', value}]} -> "
        "resources[]: {resource_type, resource_name, error_code, error_message}",
    ),
    Api(
        "IncrementalAlterConfigs",
        "write",
        ("resources: list", "validate_only: bool?"),
        ("resources: list",),
        "resources[]: {resource_type: 'topic'|'broker', resource_name: str, ops: [{name, op: "
        "'SET'|'DELETE'|'APPEND'|'SUBTRACT', value: str?}]} -> resources[]: {resource_type, "
        "resource_name, error_code, error_message}",
    ),
    Api(
        "ElectLeaders",
        "write",
        ("election_type: str", "partitions: list?"),
        ("partitions: list",),
        "election_type 'preferred'|'unclean'; partitions[]: {topic: str, partition: int} (null = "
        "all) -> partitions[]: {topic, partition, leader, error_code, error_message}",
    ),
    Api(
        "BrokerRegistration",
        "write",
        (
            "broker_id: int",
            "cluster_id: str",
            "incarnation_id: str",
            "listeners: list",
            "rack: str?",
            "features: list?",
        ),
        ("broker_epoch: int",),
        "listeners[]: {name, host, port, security_protocol}; features[]: {name, min_version, "
        "max_version}. Errors: INCONSISTENT_CLUSTER_ID, DUPLICATE_BROKER_REGISTRATION, "
        "UNSUPPORTED_VERSION",
    ),
    Api("UnregisterBroker", "write", ("broker_id: int",), (), ""),
    Api(
        "FenceBroker",
        "write",
        ("broker_id: int", "broker_epoch: int", "reason: str"),
        (),
        "issued by the active controller's session timer (reason 'session-timeout') or a heartbeat "
        "with want_fence",
    ),
    Api(
        "UnfenceBroker",
        "write",
        ("broker_id: int", "broker_epoch: int"),
        (),
        "issued by the heartbeat manager once the broker is caught up",
    ),
    Api(
        "BeginControlledShutdown",
        "write",
        ("broker_id: int", "broker_epoch: int"),
        (),
        "issued by the heartbeat manager when an unfenced broker asks to shut down",
    ),
    Api(
        "AlterPartition",
        "write",
        ("broker_id: int", "broker_epoch: int", "topics: list"),
        ("topics: list",),
        "topics[]: {topic_id, partitions: [{partition, leader_epoch, partition_epoch, isr: [int], "
        "leader_recovery_state: int?, reason: str?}]} -> topics[]: {topic_id, partitions: "
        "[{partition, error_code, error_message, leader, leader_epoch, partition_epoch, isr}]}",
    ),
    Api(
        "AllocateProducerIds",
        "write",
        ("broker_id: int", "broker_epoch: int"),
        ("producer_id_start: int", "producer_id_len: int"),
        "",
    ),
    Api(
        "ActivateController",
        "write",
        ("leader_id: int", "term: int"),
        (),
        "first write of a newly active controller",
    ),
    Api("NoOp", "write", (), (), "idle write so followers' lag keeps moving"),
    # ---- reads (any controller; the response says which offset it reflects) ----------------
    Api(
        "ListTopics",
        "read",
        (),
        ("offset: int", "topics: list"),
        "topics[]: {name, topic_id, partitions}",
    ),
    Api(
        "DescribeTopics",
        "read",
        ("names: list?",),
        ("offset: int", "topics: list"),
        "names null = all -> topics[]: {name, topic_id, error_code, error_message, configs: map, "
        "partitions: [{partition, leader, leader_epoch, partition_epoch, replicas, isr, "
        "removing_replicas, adding_replicas, leader_recovery_state}]}",
    ),
    Api(
        "DescribeConfigs",
        "read",
        ("resources: list",),
        ("offset: int", "resources: list"),
        "resources[]: {resource_type: 'topic'|'broker', resource_name} -> resources[]: "
        "{resource_type, resource_name, error_code, error_message, configs: [{name, value, "
        "source: 'dynamic'|'default', read_only: bool, sensitive: bool}]}",
    ),
    Api(
        "DescribeCluster",
        "read",
        (),
        ("offset: int", "cluster_id: str", "controller_id: int", "brokers: list"),
        "brokers[]: {broker_id, epoch, incarnation_id, rack, fenced, in_controlled_shutdown, "
        "listeners, state: 'fenced'|'unfenced'|'controlled-shutdown'}",
    ),
    # ---- handled by the controller node itself ---------------------------------------------
    Api(
        "BrokerHeartbeat",
        "node",
        (
            "broker_id: int",
            "broker_epoch: int",
            "metadata_offset: int",
            "want_fence: bool",
            "want_shutdown: bool",
        ),
        ("is_caught_up: bool", "is_fenced: bool", "should_shut_down: bool"),
        "",
    ),
    Api(
        "FetchMetadata",
        "node",
        ("from_offset: int", "max_wait_ms: int?", "max_bytes: int?"),
        ("batches: list", "high_watermark: int", "snapshot: map?"),
        "batches: encoded batches (bytes) with base_offset >= from_offset's batch; snapshot "
        "{name, end_offset, size} when from_offset is before the log start",
    ),
    Api(
        "FetchSnapshot",
        "node",
        ("name: str", "position: int", "max_bytes: int?"),
        ("data: bytes", "size: int", "done: bool"),
        "",
    ),
    Api(
        "DescribeQuorum",
        "node",
        (),
        (
            "leader_id: int",
            "term: int",
            "commit_index: int",
            "high_watermark: int",
            "voters: list",
            "observers: list",
        ),
        "voters[]: {node_id, host, port, applied_offset, lag, last_contact_ms, is_leader, "
        "log_head: {offset, hash} | null, divergent_from_offset: int | null}; "
        "observers[]: {broker_id, metadata_offset, last_contact_ms}; divergent_voters: [node_id]",
    ),
    Api(
        "DescribeNode",
        "node",
        (),
        (
            "node_id: int",
            "is_active: bool",
            "applied_offset: int",
            "image_checksum: str",
            "log_start_offset: int",
            "log_end_offset: int",
        ),
        "also raft: the quorum member's status, raft_stats: its counters (group commit, journal "
        "syncs, ticks); log_head: {offset, hash} (the last record's offset, the hash of the batch "
        "ending there); request hash_at: [offset] -> hashes: [[offset, hash | '' (no batch ends "
        "there) | null (not held)]]",
    ),
]

APIS: dict[str, Api] = {a.name: a for a in _APIS}

_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "str": (str,),
    "bool": (bool,),
    "list": (list, tuple),
    "map": (dict,),
    "bytes": (bytes,),
    "any": (object,),
}


def _parse(spec: str) -> tuple[str, tuple[type, ...], bool]:
    name, _, type_name = spec.partition(": ")
    optional = type_name.endswith("?")
    return name, _TYPES[type_name.rstrip("?")], optional


# Request field specs parsed once (validate_request runs for every request, twice for writes).
_REQUEST_FIELDS: dict[str, tuple[tuple[str, tuple[type, ...], bool], ...]] = {
    a.name: tuple(_parse(spec) for spec in a.request) for a in _APIS
}


def validate_request(api_name: str, body: Any) -> Api:
    """Return the API if ``body`` has its required fields with the right types, else raise
    ``KraftError(INVALID_REQUEST)``; an unknown API raises ``UNSUPPORTED_VERSION``."""
    api = APIS.get(api_name) if isinstance(api_name, str) else None
    if api is None:
        raise KraftError(ErrorCode.UNSUPPORTED_VERSION, f"unknown API {api_name!r}")
    if not isinstance(body, dict):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{api.name}: the body must be a map")
    for name, types, optional in _REQUEST_FIELDS[api.name]:
        value = body.get(name)
        if value is None:
            if optional:
                continue
            raise KraftError(ErrorCode.INVALID_REQUEST, f"{api.name}: missing field {name!r}")
        if not isinstance(value, types) or (types == (int,) and isinstance(value, bool)):
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                f"{api.name}: field {name!r} has the wrong type ({type(value).__name__})",
            )
    return api
