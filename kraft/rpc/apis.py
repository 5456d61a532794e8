"""Every controller RPC API and its kind; the bodies' types are in :mod:`kraft.rpc.bodies`.

One place for the API names the state machine, the controller, the CLI and the broker share.
:func:`check_request` is the RPC server's envelope check (a known API, a map body); the typed
check of the body's fields happens at the controller's dispatch
(:func:`kraft.rpc.bodies.decode_request`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kraft.errors import ErrorCode, KraftError


@dataclass(frozen=True)
class Api:
    name: str
    kind: str  # "write" (replicated), "read" (any controller), "node" (handled by the node)
    doc: str = ""


_APIS = [
    # ---- replicated writes (the active controller) --------------------------------------------
    Api("CreateTopics", "write", "num_partitions/replication_factor -1: the defaults"),
    Api("CreatePartitions", "write"),
    Api("DeleteTopics", "write"),
    Api("AlterConfigs", "write", "legacy: each resource's dynamic configs become the given set"),
    Api("IncrementalAlterConfigs", "write"),
    Api("ElectLeaders", "write", "election_type 'preferred' | 'unclean'; partitions null: all"),
    Api(
        "BrokerRegistration",
        "write",
        "errors: INCONSISTENT_CLUSTER_ID, DUPLICATE_BROKER_REGISTRATION, UNSUPPORTED_VERSION",
    ),
    Api("UnregisterBroker", "write"),
    Api("FenceBroker", "write", "issued by the session timer or a heartbeat (want_fence)"),
    Api("UnfenceBroker", "write", "issued by the heartbeat manager once the broker caught up"),
    Api("BeginControlledShutdown", "write", "issued when an unfenced broker asks to stop"),
    Api("LogDirsOffline", "write", "issued when a heartbeat reports replicas on offline log dirs"),
    Api("AlterPartition", "write"),
    Api("AllocateProducerIds", "write"),
    Api("ActivateController", "write", "first write of a newly active controller"),
    Api("NoOp", "write", "idle write so followers' lag keeps moving"),
    # ---- reads (any controller; the response says which offset it reflects) ------------------
    Api("ListTopics", "read"),
    Api("DescribeTopics", "read", "names null: all"),
    Api("DescribeConfigs", "read"),
    Api("DescribeCluster", "read"),
    # ---- handled by the controller node itself -----------------------------------------------
    Api("BrokerHeartbeat", "node"),
    Api("FetchMetadata", "node", "long-poll; a snapshot to load when the offset is too old"),
    Api("FetchSnapshot", "node"),
    Api("DescribeQuorum", "node", "a follower asks the leader (one hop)"),
    Api("DescribeNode", "node", "hash_at: [offset] -> hashes"),
]

APIS: dict[str, Api] = {a.name: a for a in _APIS}


def check_request(api_name: Any, body: Any) -> Api:
    """Return the API if ``api_name`` names one and ``body`` is a map, else raise
    ``KraftError`` (``UNSUPPORTED_VERSION`` for an unknown API, ``INVALID_REQUEST``)."""
    api = APIS.get(api_name) if isinstance(api_name, str) else None
    if api is None:
        raise KraftError(ErrorCode.UNSUPPORTED_VERSION, f"unknown API {api_name!r}")
    if not isinstance(body, dict):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{api.name}: the body must be a map")
    return api
