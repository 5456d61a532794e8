"""Kafka admin APIs on the broker listener, forwarded to the active controller.

:class:`KafkaAdmin` is the listener's ``admin=`` handler. It decodes CreateTopics,
DeleteTopics, CreatePartitions, DescribeConfigs, IncrementalAlterConfigs, AlterConfigs (legacy) and ElectLeaders with
kio (:mod:`broker.protocol.admin_decode`), forwards each as one controller RPC call through a :class:`ControllerClient` (which follows
the active controller and retries until the request's timeout), and encodes the answer as the
Kafka response with per-item error codes and messages. DescribeCluster is answered from the
broker's metadata image. Writes carry ``<kafka client id>@broker-<id>`` as their client id, so
the metadata log's provenance says which Kafka client asked through which broker.

Forwarded calls run as the Kafka client's principal, never the broker's: the broker
authenticates to the controllers as itself and names the client in ``on_behalf_of``, which the
controllers accept from broker principals only (:mod:`kraft.rpc.authorize`). When the
controllers require authentication (the broker holds RPC credentials), a request from a client
that did not authenticate (a PLAINTEXT listener, SSL without a client certificate) is not
forwarded: every item is answered ``CLUSTER_AUTHORIZATION_FAILED``.

A request no active controller answers before its timeout (no quorum, controllers down) gets
``REQUEST_TIMED_OUT`` on every item, never ``NOT_CONTROLLER`` (the write may still be applied
later, as in Kafka). An undecodable request raises ``DecodeError`` (the listener closes that
connection).
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import sys
import types
import typing
from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any

import trio
from kio.schema.errors import ErrorCode as KafkaError

from broker.metadata.metadata_cache import MetadataCache
from broker.protocol import admin_mapping as m
from broker.protocol.admin_decode import decode_request
from broker.protocol.kafka_codec import (
    DecodeError,
    Reader,
    RequestHeader,
    encode_body,
    frame_response,
    response_class,
)
from kraft.errors import ErrorCode, KraftError
from kraft.rpc.client import ControllerClient

log = logging.getLogger(__name__)

API_CREATE_TOPICS, API_DELETE_TOPICS, API_DESCRIBE_CONFIGS = 19, 20, 32
API_CREATE_PARTITIONS, API_ELECT_LEADERS, API_INCREMENTAL_ALTER_CONFIGS = 37, 43, 44
API_DESCRIBE_CLUSTER = 60
API_ALTER_CONFIGS = 33

# api key -> (min, max) version served: every version kio knows for these APIs
RANGES: dict[int, tuple[int, int]] = {
    API_CREATE_TOPICS: (2, 7),
    API_DELETE_TOPICS: (1, 6),
    API_DESCRIBE_CONFIGS: (1, 4),
    API_CREATE_PARTITIONS: (0, 3),
    API_ELECT_LEADERS: (0, 2),
    API_INCREMENTAL_ALTER_CONFIGS: (0, 1),
    API_ALTER_CONFIGS: (0, 2),
    API_DESCRIBE_CLUSTER: (0, 2),
}
# controller-side unavailability the Kafka client sees as a timeout (it cannot pick another
# controller: any broker forwards to the same quorum)
_NO_CONTROLLER = {
    ErrorCode.NOT_CONTROLLER,
    ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT,
}
AUTO_CREATE_TIMEOUT_S = 5.0  # a Metadata request waits this long for an auto-created topic
ANONYMOUS = "User:ANONYMOUS"
# the Kafka client principal of the request being handled (one KafkaAdmin serves every
# connection; each handle() runs in its own connection's task)
_CLIENT_PRINCIPAL: contextvars.ContextVar[str] = contextvars.ContextVar(
    "kafka_client_principal", default=ANONYMOUS
)
DEFAULT_TIMEOUT_S = 30.0  # for requests whose timeout is 0 or absent
MAX_TIMEOUT_S = 300.0


@cache
def _nested(cls: type) -> dict[str, type]:
    """Field name -> entity class of the field's items, for array fields (nullable ones too,
    which ``kafka_codec.build`` leaves alone)."""
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    out: dict[str, type] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        for option in options:
            args = typing.get_args(option)
            if args and dataclasses.is_dataclass(args[0]):
                out[f.name] = typing.cast(type, args[0])
    return out


@cache
def _names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def build_entity(cls: type, values: dict[str, Any]) -> Any:
    """A kio entity from ``values`` for any version: keys the version lacks are dropped, lists
    of dicts become tuples of the item entity, None stays None."""
    nested = _nested(cls)
    names = _names(cls)
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in names:
            continue
        if key in nested and value is not None:  # items already entities pass as they are
            value = tuple(
                item if dataclasses.is_dataclass(item) else build_entity(nested[key], item)
                for item in value
            )
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    return cls(**kwargs)


def request_timeout(req: Any) -> float:
    """The request's own timeout in seconds, or the default when it gives none."""
    timeout = getattr(req, "timeout", None)
    seconds = timeout.total_seconds() if timeout is not None else 0.0
    return min(seconds, MAX_TIMEOUT_S) if seconds > 0 else DEFAULT_TIMEOUT_S


class KafkaAdmin:
    """Admin API handler for :class:`broker.protocol.kafka_listener.KafkaListener` (``admin=``)."""

    def __init__(
        self,
        cache: MetadataCache,
        client: ControllerClient,
        node_id: int,
        *,
        require_authenticated: bool | None = None,
    ) -> None:
        self.cache = cache
        self.client = client
        self.node_id = node_id
        # default: the controllers require authentication when this broker logs in to them
        self.require_authenticated = (
            client.credentials is not None
            if require_authenticated is None
            else require_authenticated
        )
        self._apis: dict[int, Callable[[RequestHeader, Any], Awaitable[dict[str, Any]]]] = {
            API_CREATE_TOPICS: self._create_topics,
            API_DELETE_TOPICS: self._delete_topics,
            API_DESCRIBE_CONFIGS: self._describe_configs,
            API_CREATE_PARTITIONS: self._create_partitions,
            API_ELECT_LEADERS: self._elect_leaders,
            API_INCREMENTAL_ALTER_CONFIGS: self._incremental_alter_configs,
            API_ALTER_CONFIGS: self._alter_configs,
            API_DESCRIBE_CLUSTER: self._describe_cluster,
        }

    def api_ranges(self) -> dict[int, tuple[int, int]]:
        return dict(RANGES)

    async def handle(
        self, header: RequestHeader, reader: Reader, principal: str = ANONYMOUS
    ) -> bytes:
        """Decode, answer (forwarding to the controller where needed, as ``principal``: the
        connection's authenticated Kafka principal) and frame the response."""
        req = decode_request(header, reader)
        log.info(
            "Kafka admin API %d v%d from client %r (%s)",
            header.api_key,
            header.api_version,
            header.client_id,
            principal,
        )
        _CLIENT_PRINCIPAL.set(principal)
        try:
            values = await self._apis[header.api_key](header, req)
            cls = response_class(header.api_key, header.api_version)
            return frame_response(
                cls, header.correlation_id, encode_body(build_entity(cls, values))
            )
        except Exception as e:  # a bug here must close one connection, not stop the broker
            log.exception(
                "API %d v%d from client %r failed",
                header.api_key,
                header.api_version,
                header.client_id,
            )
            raise DecodeError(f"internal error: {e}") from None

    async def _forward(
        self, header: RequestHeader, api: str, body: dict[str, Any], timeout: float
    ) -> dict[str, Any] | KraftError:
        """One controller call; a failure comes back as the error instead of raising."""
        # call() builds its request envelope (client id included) before its first await, so
        # setting the id right before calling is safe: this client is used only from here.
        self.client.client_id = f"{header.client_id or ''}@broker-{self.node_id}"
        principal = _CLIENT_PRINCIPAL.get()
        if self.require_authenticated and principal == ANONYMOUS:
            log.warning("%s from unauthenticated client %r: not forwarded", api, header.client_id)
            return KraftError(
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "The controllers require authentication: connect to a SASL listener (or SSL "
                "with a client certificate) to use admin APIs.",
            )
        try:
            return await self.client.call(api, body, timeout=timeout, on_behalf_of=principal)
        except KraftError as e:
            log.info("%s from client %r: controller call failed: %s", api, header.client_id, e)
            if e.code in _NO_CONTROLLER:  # the client cannot do better than retry later
                return KraftError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"No active controller answered within {timeout:g} s (last error: {e}).",
                )
            return e

    async def auto_create_topics(self, header: RequestHeader, names: list[str]) -> None:
        """``auto.create.topics.enable``: create ``names`` with the controller's
        ``num.partitions`` and ``default.replication.factor`` (provenance reason
        ``auto-create``), then wait briefly for this broker's metadata to show them."""
        body = {
            "topics": [{"name": n, "num_partitions": -1, "replication_factor": -1} for n in names],
            "auto_create": True,
        }
        # The operator's auto.create.topics.enable is the authority here, so an anonymous
        # client's topic is created as the broker itself (the records still name the client
        # id and the reason auto-create); an authenticated client's as that client.
        principal = _CLIENT_PRINCIPAL.get()
        self.client.client_id = f"{header.client_id or ''}@broker-{self.node_id}"
        resp: dict[str, Any] | KraftError
        try:
            resp = await self.client.call(
                "CreateTopics",
                body,
                timeout=AUTO_CREATE_TIMEOUT_S,
                on_behalf_of=None if principal == ANONYMOUS else principal,
            )
        except KraftError as e:
            log.info("auto-create of %s for client %r failed: %s", names, header.client_id, e)
            return
        created = [r["name"] for r in _items(resp, "topics", len(names)) if not r.get("error_code")]
        if created:
            log.info("auto-created topics %s for client %r", created, header.client_id)
        with trio.move_on_after(AUTO_CREATE_TIMEOUT_S):
            while self.cache.image is None or any(
                n not in self.cache.image.topics_by_name for n in created
            ):
                await trio.sleep(0.02)  # the loader publishes the new image soon after commit

    async def _create_topics(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        body, refused = m.create_topics_body(req)
        results: list[dict[str, Any]] = []
        if body["topics"]:
            resp = await self._forward(header, "CreateTopics", body, request_timeout(req))
            results = _items(resp, "topics", len(body["topics"]))
        configs = None
        created = [r["name"] for r in results if not r.get("error_code") and r.get("name")]
        if header.api_version >= 5 and created and not body["validate_only"]:
            # v5+ answers with the new topics' configs: ask the controller that just created them
            resources = [{"resource_type": "topic", "resource_name": n} for n in created]
            described = await self._forward(
                header, "DescribeConfigs", {"resources": resources}, DEFAULT_TIMEOUT_S
            )
            configs = dict(zip(created, _items(described, "resources", len(created))))
        return m.create_topics_values(req, results, refused, configs)

    async def _delete_topics(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        image = self.cache.image
        name_of_id = (
            {tid: t.name for tid, t in image.topics_by_id.items()} if image is not None else {}
        )
        requested = m.delete_topic_names(req, name_of_id)
        names = [n for n, _ in requested if n is not None]
        results: list[dict[str, Any]] = []
        if names:
            resp = await self._forward(
                header, "DeleteTopics", {"names": names}, request_timeout(req)
            )
            results = _items(resp, "topics", len(names))
        return m.delete_topics_values(requested, results)

    async def _create_partitions(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        body = m.create_partitions_body(req)
        results: list[dict[str, Any]] = []
        if body["topics"]:
            resp = await self._forward(header, "CreatePartitions", body, request_timeout(req))
            results = _items(resp, "topics", len(body["topics"]))
        return m.create_partitions_values(req, results)

    async def _describe_configs(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        body, refused = m.describe_configs_body(req)
        results: list[dict[str, Any]] = []
        if body["resources"]:
            resp = await self._forward(header, "DescribeConfigs", body, DEFAULT_TIMEOUT_S)
            results = _items(resp, "resources", len(body["resources"]))
        return m.describe_configs_values(req, results, refused)

    async def _incremental_alter_configs(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        body, refused = m.incremental_alter_configs_body(req)
        results: list[dict[str, Any]] = []
        if body["resources"]:
            resp = await self._forward(header, "IncrementalAlterConfigs", body, DEFAULT_TIMEOUT_S)
            results = _items(resp, "resources", len(body["resources"]))
        return m.alter_configs_values(req, results, refused)

    async def _alter_configs(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        body, refused = m.legacy_alter_configs_body(req)
        results: list[dict[str, Any]] = []
        if body["resources"]:
            resp = await self._forward(header, "AlterConfigs", body, DEFAULT_TIMEOUT_S)
            results = _items(resp, "resources", len(body["resources"]))
        return m.alter_configs_values(req, results, refused)

    async def _elect_leaders(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        body = m.elect_leaders_body(req)
        if isinstance(body, KafkaError):
            return m.elect_leaders_values([], body, f"Unknown election type {req.election_type}.")
        resp = await self._forward(header, "ElectLeaders", body, request_timeout(req))
        if isinstance(resp, KraftError):
            item = m.failed(resp)
            return m.elect_leaders_values(
                m.elect_leaders_failed(req, item), m.kafka_error(resp.code), item["error_message"]
            )
        return m.elect_leaders_values(resp.get("partitions", []))

    async def _describe_cluster(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        return m.describe_cluster_values(
            self.cache.image,
            self.cache.cluster_id,
            self.cache.listener_name,
            int(getattr(req, "endpoint_type", 1)),
            bool(getattr(req, "include_fenced_brokers", False)),
        )


def _items(resp: dict[str, Any] | KraftError, key: str, count: int) -> list[dict[str, Any]]:
    """The controller's per-item results, or ``count`` copies of a forwarding failure."""
    if isinstance(resp, KraftError):
        return [m.failed(resp)] * count
    items = resp.get(key)
    return list(items) if isinstance(items, list) else []
