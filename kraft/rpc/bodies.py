"""The controller RPC's request and response bodies as typed ``msgspec`` structs.

One struct per body, with nested structs for the items of its lists; field names are the wire
names (msgpack maps). :func:`decode_request` checks a request body against its struct at the
edge (the controller's dispatch): a body that does not fit is refused with ``INVALID_REQUEST``
naming the field, and no handler runs. Unknown fields are tolerated and optional fields keep
their defaults, so clients of older (and newer) versions keep working during a rolling upgrade.

Optional fields are ``T | None = None``: absent and null mean the same, as they always have on
this wire. Replicated writes still hand the request's map to their pure handlers
(``kraft/controller``); the node's own APIs get the struct.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kraft.errors import ErrorCode, KraftError

__all__ = ["REQUESTS", "RESPONSES", "decode_request", "encode_response"]


class Body(msgspec.Struct, kw_only=True):
    """A request or response body, or an item of one (a msgpack map on the wire)."""


# ---- items ----------------------------------------------------------------------------------


class CreatableTopic(Body):
    name: str
    num_partitions: int | None = None  # -1 or absent: num.partitions
    replication_factor: int | None = None  # -1 or absent: default.replication.factor
    assignments: dict[int, list[int]] | None = None  # partition → broker ids
    configs: dict[str, str | None] | None = None


class CreatedTopic(Body):
    name: str
    error_code: int
    error_message: str
    topic_id: str = ""
    num_partitions: int = -1
    replication_factor: int = -1


class NewPartitions(Body):
    name: str
    count: int
    assignments: list[list[int]] | None = None  # broker ids per new partition


class TopicError(Body):
    name: str
    error_code: int
    error_message: str
    topic_id: str | None = None


class ConfigOp(Body):
    name: str
    op: str  # 'SET' | 'DELETE' | 'APPEND' | 'SUBTRACT' (AlterConfigs: 'SET' only)
    value: str | None = None


class ConfigResource(Body):
    resource_type: str  # 'topic' | 'broker'
    resource_name: str
    ops: list[ConfigOp]


class ResourceRef(Body):
    resource_type: str
    resource_name: str


class ResourceError(Body):
    resource_type: str
    resource_name: str
    error_code: int
    error_message: str


class TopicPartition(Body):
    topic: str
    partition: int


class ElectionResult(Body):
    topic: str
    partition: int
    error_code: int
    error_message: str
    leader: int | None = None


class Listener(Body):
    name: str
    host: str
    port: int
    security_protocol: str


class SupportedFeature(Body):
    name: str
    min_version: int
    max_version: int


class PartitionIsrChange(Body):
    partition: int
    leader_epoch: int
    partition_epoch: int
    isr: list[int]
    leader_recovery_state: int | None = None
    reason: str | None = None


class TopicIsrChanges(Body):
    topic_id: str
    partitions: list[PartitionIsrChange]


class PartitionIsrResult(Body):
    partition: int
    error_code: int
    error_message: str
    leader: int | None = None
    leader_epoch: int | None = None
    partition_epoch: int | None = None
    isr: list[int] | None = None


class TopicIsrResults(Body):
    topic_id: str
    partitions: list[PartitionIsrResult]


class TopicSummary(Body):
    name: str
    topic_id: str
    partitions: int


class PartitionDescription(Body):
    partition: int
    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: list[int]
    isr: list[int]
    removing_replicas: list[int]
    adding_replicas: list[int]
    leader_recovery_state: int


class TopicDescription(Body):
    name: str
    topic_id: str
    error_code: int
    error_message: str
    configs: dict[str, str]
    partitions: list[PartitionDescription]


class ConfigEntry(Body):
    name: str
    value: str | None
    source: str  # 'dynamic' | 'default'
    read_only: bool
    sensitive: bool


class ResourceConfigs(Body):
    resource_type: str
    resource_name: str
    error_code: int
    error_message: str
    configs: list[ConfigEntry]


class BrokerDescription(Body):
    broker_id: int
    epoch: int
    incarnation_id: str
    rack: str | None
    fenced: bool
    in_controlled_shutdown: bool
    listeners: list[Listener]
    state: str  # 'fenced' | 'unfenced' | 'controlled-shutdown'
    # what the broker's heartbeats report offline (known to the active controller only)
    offline_log_dirs: list[str] = []  # paths, else directory ids
    offline_replicas: int = 0
    image_mismatch: ImageMismatch | None = None  # known to the active controller only


class SnapshotRef(Body):
    name: str
    end_offset: int
    size: int


class LogHead(Body):
    offset: int
    hash: str


class VoterStatus(Body):
    node_id: int
    host: str
    port: int
    raft_match_index: int | None
    applied_offset: int | None
    lag: int | None
    last_contact_ms: int | None
    last_caught_up_ms: int | None
    is_leader: bool
    log_head: LogHead | None
    divergent_from_offset: int | None


class ImageChecksum(Body):
    """A controller's image checksum at ``offset`` (FetchMetadata, when asked)."""

    offset: int
    checksum: str
    node_id: int


class ImageMismatch(Body):
    """A broker's image differing from a controller's (BrokerHeartbeat, DescribeCluster)."""

    offset: int
    checksum: str  # the broker's
    controller_checksum: str
    controller_id: int
    fenced: bool  # it differed again after a reload: the broker asks to be fenced


class ObserverStatus(Body):
    broker_id: int
    metadata_offset: int
    lag: int
    last_contact_ms: int
    last_caught_up_ms: int | None


# ---- requests and responses -------------------------------------------------------------------


class Empty(Body):
    """A body with no fields (unknown ones are ignored)."""


class WriteResponse(Body):
    """Every write answers with its error pair; a retried write also says ``duplicate``."""

    error_code: int = 0
    error_message: str = ""
    duplicate: bool | None = None


class CreateTopicsRequest(Body):
    topics: list[CreatableTopic]
    validate_only: bool | None = None
    auto_create: bool | None = None  # a broker creating topics for auto.create.topics.enable


class CreateTopicsResponse(WriteResponse):
    topics: list[CreatedTopic] = []


class CreatePartitionsRequest(Body):
    topics: list[NewPartitions]
    validate_only: bool | None = None


class TopicErrorsResponse(WriteResponse):
    topics: list[TopicError] = []


class DeleteTopicsRequest(Body):
    names: list[str]


class AlterConfigsRequest(Body):
    resources: list[ConfigResource]
    validate_only: bool | None = None


class AlterConfigsResponse(WriteResponse):
    resources: list[ResourceError] = []


class ElectLeadersRequest(Body):
    election_type: str  # 'preferred' | 'unclean'
    partitions: list[TopicPartition] | None = None  # None: all


class ElectLeadersResponse(WriteResponse):
    partitions: list[ElectionResult] = []


class BrokerRegistrationRequest(Body):
    broker_id: int
    cluster_id: str
    incarnation_id: str
    listeners: list[Listener]
    rack: str | None = None
    features: list[SupportedFeature] | None = None
    # KIP-966's PreviousBrokerEpoch: the epoch the broker's disks were last registered with
    previous_broker_epoch: int = -1


class BrokerRegistrationResponse(WriteResponse):
    broker_epoch: int = -1


class BrokerIdRequest(Body):
    broker_id: int


class BrokerEpochRequest(Body):
    broker_id: int
    broker_epoch: int


class FenceBrokerRequest(BrokerEpochRequest):
    reason: str
    also: list[BrokerEpochRequest] | None = None  # fenced with it (sessions expired together)


class AlterPartitionRequest(BrokerEpochRequest):
    topics: list[TopicIsrChanges]


class AlterPartitionResponse(WriteResponse):
    topics: list[TopicIsrResults] = []


class AllocateProducerIdsResponse(WriteResponse):
    producer_id_start: int = -1
    producer_id_len: int = 0


class ActivateControllerRequest(Body):
    leader_id: int
    term: int


class DescribeTopicsRequest(Body):
    names: list[str] | None = None  # None: all


class DescribeConfigsRequest(Body):
    resources: list[ResourceRef]


class ReadResponse(Body):
    """Every read says which image offset it reflects."""

    offset: int
    error_code: int = 0
    error_message: str = ""


class ListTopicsResponse(ReadResponse):
    topics: list[TopicSummary] = []


class DescribeTopicsResponse(ReadResponse):
    topics: list[TopicDescription] = []


class DescribeConfigsResponse(ReadResponse):
    resources: list[ResourceConfigs] = []


class DescribeClusterResponse(ReadResponse):
    cluster_id: str = ""
    controller_id: int = -1
    brokers: list[BrokerDescription] = []
    divergent_brokers: list[int] | None = None  # None: not answered by the active controller


class OfflineReplica(Body):
    """A replica on one of the broker's offline log dirs (pykraft's extension of KIP-858's
    OfflineLogDirs: there are no per-replica directory assignments in pykraft's records)."""

    topic_id: str
    partition: int


class BrokerHeartbeatRequest(BrokerEpochRequest):
    metadata_offset: int
    want_fence: bool
    want_shutdown: bool
    # KIP-858 (JBOD): the directory ids of the broker's offline log dirs, their paths (same
    # order), and the replicas on them; sent in every heartbeat until the broker restarts
    offline_log_dirs: list[str] = []
    offline_log_dir_paths: list[str] = []
    offline_replicas: list[OfflineReplica] = []
    image_mismatch: ImageMismatch | None = None  # the broker's image differs from a controller's


class LogDirsOfflineRequest(BrokerEpochRequest):
    """Issued by the active controller from a heartbeat: these replicas leave ISR and leadership."""

    offline_replicas: list[OfflineReplica] = []


class BrokerHeartbeatResponse(Body):
    is_caught_up: bool
    is_fenced: bool
    should_shut_down: bool


class FetchMetadataRequest(Body):
    from_offset: int
    max_wait_ms: int | None = None
    max_bytes: int | None = None
    # only the active controller answers (others: NOT_CONTROLLER with the leader): a follower
    # learns a commit with the leader's next append round, ~20 ms later (brokers set it)
    leader_only: bool = False
    image_checksum: bool | None = None  # true: state the image checksum where possible


class FetchMetadataResponse(Body, omit_defaults=True):  # no image_checksum key unless stated
    batches: list[bytes]  # encoded batches, the first one holding ``from_offset``
    high_watermark: int
    snapshot: SnapshotRef | None  # set when the fetcher should load this snapshot instead
    # asked for, and this controller's image is at the offset the fetcher reaches with this answer
    image_checksum: ImageChecksum | None = None


class FetchSnapshotRequest(Body):
    name: str
    position: int
    max_bytes: int | None = None


class FetchSnapshotResponse(Body):
    data: bytes
    size: int
    done: bool


class DescribeClusterRequest(Body):
    active_only: bool | None = None  # a standby answers NOT_CONTROLLER (with the leader hint)


class DescribeQuorumRequest(Body):
    forwarded: bool | None = None  # a controller asking the leader on a client's behalf


class DescribeQuorumResponse(Body):
    cluster_id: str
    leader_id: int
    term: int
    commit_index: int
    high_watermark: int
    voters: list[VoterStatus]
    observers: list[ObserverStatus]
    divergent_voters: list[int]


class DescribeNodeRequest(Body):
    checksum: bool | None = True  # null or false: skip the image checksum
    hash_at: list[int] | None = None


class DescribeNodeResponse(Body):
    node_id: int
    is_active: bool
    applied_offset: int
    image_checksum: str | None
    log_start_offset: int
    log_end_offset: int
    log_head: LogHead | None
    hashes: list[list[Any]]  # [offset, hash | '' (no batch ends there) | null (not held)]
    raft: dict[str, Any]
    raft_stats: dict[str, Any]
    joining: bool
    directory_id: str
    unverified_voters: list[int]


REQUESTS: dict[str, type[Body]] = {
    "CreateTopics": CreateTopicsRequest,
    "CreatePartitions": CreatePartitionsRequest,
    "DeleteTopics": DeleteTopicsRequest,
    "AlterConfigs": AlterConfigsRequest,
    "IncrementalAlterConfigs": AlterConfigsRequest,
    "ElectLeaders": ElectLeadersRequest,
    "BrokerRegistration": BrokerRegistrationRequest,
    "UnregisterBroker": BrokerIdRequest,
    "FenceBroker": FenceBrokerRequest,
    "UnfenceBroker": BrokerEpochRequest,
    "BeginControlledShutdown": BrokerEpochRequest,
    "LogDirsOffline": LogDirsOfflineRequest,
    "AlterPartition": AlterPartitionRequest,
    "AllocateProducerIds": BrokerEpochRequest,
    "ActivateController": ActivateControllerRequest,
    "NoOp": Empty,
    "ListTopics": Empty,
    "DescribeTopics": DescribeTopicsRequest,
    "DescribeConfigs": DescribeConfigsRequest,
    "DescribeCluster": DescribeClusterRequest,
    "BrokerHeartbeat": BrokerHeartbeatRequest,
    "FetchMetadata": FetchMetadataRequest,
    "FetchSnapshot": FetchSnapshotRequest,
    "DescribeQuorum": DescribeQuorumRequest,
    "DescribeNode": DescribeNodeRequest,
}

RESPONSES: dict[str, type[Body]] = {
    "CreateTopics": CreateTopicsResponse,
    "CreatePartitions": TopicErrorsResponse,
    "DeleteTopics": TopicErrorsResponse,
    "AlterConfigs": AlterConfigsResponse,
    "IncrementalAlterConfigs": AlterConfigsResponse,
    "ElectLeaders": ElectLeadersResponse,
    "BrokerRegistration": BrokerRegistrationResponse,
    "UnregisterBroker": WriteResponse,
    "FenceBroker": WriteResponse,
    "UnfenceBroker": WriteResponse,
    "BeginControlledShutdown": WriteResponse,
    "LogDirsOffline": WriteResponse,
    "AlterPartition": AlterPartitionResponse,
    "AllocateProducerIds": AllocateProducerIdsResponse,
    "ActivateController": WriteResponse,
    "NoOp": WriteResponse,
    "ListTopics": ListTopicsResponse,
    "DescribeTopics": DescribeTopicsResponse,
    "DescribeConfigs": DescribeConfigsResponse,
    "DescribeCluster": DescribeClusterResponse,
    "BrokerHeartbeat": BrokerHeartbeatResponse,
    "FetchMetadata": FetchMetadataResponse,
    "FetchSnapshot": FetchSnapshotResponse,
    "DescribeQuorum": DescribeQuorumResponse,
    "DescribeNode": DescribeNodeResponse,
}


def _where(error: msgspec.ValidationError) -> str:
    """msgspec's message with the body as the root of the path (``at `topics[0].name```)."""
    return str(error).replace("`$.", "`").replace("`$`", "the body").replace("`$[", "`[")


def decode_request(api: str, body: Any) -> Body:
    """``body`` as ``api``'s request struct; ``KraftError(INVALID_REQUEST)`` naming the field
    when it does not fit, ``UNSUPPORTED_VERSION`` for an API without a request type."""
    request_type = REQUESTS.get(api)
    if request_type is None:
        raise KraftError(ErrorCode.UNSUPPORTED_VERSION, f"unknown API {api!r}")
    if not isinstance(body, dict):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{api}: the body must be a map")
    try:
        return msgspec.convert(body, request_type)
    except msgspec.ValidationError as e:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{api}: {_where(e)}") from None


def encode_response(body: Body) -> dict[str, Any]:
    """A response struct as the map the RPC server sends (bytes stay bytes)."""
    out: dict[str, Any] = msgspec.to_builtins(body, builtin_types=(bytes,))
    return out
