"""A broker node's configuration: the broker's settings table and :class:`BrokerConfig`.

Keys, defaults and checks are Kafka's where Kafka has the setting; the properties-file format,
the settings common to every node and the resolution rules (unknown keys refused, required keys
named) are ``kraft.config``'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kraft.config import (
    CLIENT_CREDENTIALS_KEY,
    COMMON_SETTINGS,
    ConfigError,
    Setting,
    client_credentials,
    load_properties,
    parse_bool,
    parse_hostports,
    parse_listener,
    parse_positive,
    resolve_settings,
)
from kraft.rpc.auth import ClientCredentials

__all__ = ["BROKER_SETTINGS", "BrokerConfig"]


def parse_non_negative(v: str) -> int:
    """An integer >= 0."""
    n = int(v)
    if n < 0:
        raise ValueError("expected an integer >= 0")
    return n


def _parse_ratio(v: str) -> float:
    """A number in [0, 1]."""
    x = float(v)
    if not 0 <= x <= 1:
        raise ValueError(f"{v} is not between 0 and 1")
    return x


BROKER_SETTINGS = COMMON_SETTINGS + [
    Setting("broker.rack", str, "", "rack of this broker (rack-aware placement)"),
    Setting(
        "listeners",
        str,
        "PLAINTEXT://127.0.0.1:9092",
        "Kafka listeners NAME://host:port,... "
        "(NAME is the security protocol, or mapped by listener.security.protocol.map)",
    ),
    Setting(
        "advertised.listeners", str, "", "what clients are told to connect to (default: listeners)"
    ),
    Setting("log.dirs", str, None, "where partition logs live (comma-separated)"),
    Setting(
        "controller.quorum.bootstrap.servers",
        str,
        None,
        "host:port,... of the controllers' RPC endpoints",
    ),
    Setting(
        "controller.quorum.retry.backoff.ms",
        parse_positive,
        20,
        "first wait before a failed call to the controllers is retried (then doubling)",
    ),
    Setting(
        "controller.quorum.retry.backoff.max.ms",
        parse_positive,
        200,
        "longest wait between retries to the controllers: after an election the broker "
        "fetches metadata from the new leader at most this long after it is active",
    ),
    Setting("broker.admin.port", int, 0, "broker admin/state endpoint (0 = listener port + 1000)"),
    Setting(
        "broker.admin.host",
        str,
        "",
        "admin/state endpoint address (empty: the first listener's if loopback, else "
        "127.0.0.1); it requires a sasl.plain.users.file user when the broker uses SASL",
    ),
    Setting(
        "initial.broker.registration.timeout.ms", int, 60000, "give up if not registered by then"
    ),
    Setting(
        "metadata.image.check.interval.ms",
        parse_non_negative,
        10000,
        "how often the metadata image's checksum is compared with a controller's (0 = never)",
    ),
    Setting("replica.lag.time.max.ms", int, 30000, "a follower lagging this long leaves the ISR"),
    Setting("replica.fetch.wait.max.ms", int, 500, "follower fetch long-poll"),
    Setting(
        "max.incremental.fetch.session.cache.slots",
        parse_non_negative,
        1000,
        "incremental fetch sessions (KIP-227) a broker keeps (0 = none: every fetch is full)",
    ),
    Setting("min.insync.replicas", int, 1, "default min.insync.replicas for topics without one"),
    Setting("offsets.topic.num.partitions", parse_positive, 50, "partitions of __consumer_offsets"),
    Setting(
        "offsets.topic.replication.factor",
        parse_positive,
        3,
        "replication factor of __consumer_offsets (capped at the alive brokers)",
    ),
    Setting(
        "group.initial.rebalance.delay.ms",
        int,
        3000,
        "how long the first rebalance of an empty group waits for more members",
    ),
    Setting(
        "group.consumer.session.timeout.ms",
        parse_positive,
        45000,
        "a consumer-protocol (KIP-848) member not heard from this long is fenced",
    ),
    Setting(
        "group.consumer.heartbeat.interval.ms",
        parse_positive,
        5000,
        "the heartbeat interval the coordinator gives consumer-protocol members",
    ),
    Setting(
        "group.consumer.assignors",
        str,
        "uniform,range",
        "server-side assignors of consumer-protocol groups, the first the default (names or "
        "Kafka's class names)",
    ),
    Setting(
        "group.consumer.max.size",
        parse_positive,
        2147483647,
        "most members of one consumer-protocol group (GROUP_MAX_SIZE_REACHED beyond)",
    ),
    Setting(
        "transaction.state.log.num.partitions",
        parse_positive,
        50,
        "partitions of __transaction_state",
    ),
    Setting(
        "transaction.state.log.replication.factor",
        parse_positive,
        3,
        "replication factor of __transaction_state (capped at the alive brokers)",
    ),
    Setting(
        "transaction.max.timeout.ms",
        parse_positive,
        900_000,
        "largest transaction.timeout.ms a producer may ask for",
    ),
    Setting(
        "producer.id.expiration.ms",
        parse_positive,
        86_400_000,
        "an idempotent producer id with no batch for this long is forgotten by a partition "
        "(not while it has a transaction open there)",
    ),
    Setting(
        "producer.id.expiration.check.interval.ms",
        parse_positive,
        600_000,
        "how often partitions look for expired producer ids",
    ),
    Setting(
        "transactional.id.expiration.ms",
        parse_positive,
        604_800_000,
        "a transactional id with no transaction in progress and no update for this long is "
        "forgotten (its producer id with it)",
    ),
    Setting("group.min.session.timeout.ms", int, 6000, "smallest session.timeout.ms accepted"),
    Setting("group.max.session.timeout.ms", int, 1_800_000, "largest session.timeout.ms accepted"),
    Setting("group.max.size", parse_positive, 2**31 - 1, "most members a classic group may have"),
    Setting("offset.metadata.max.bytes", int, 4096, "largest metadata of a committed offset"),
    Setting(
        "offsets.retention.minutes",
        parse_positive,
        10080,
        "committed offsets of an empty group expire after this long",
    ),
    Setting(
        "offsets.retention.check.interval.ms", parse_positive, 600_000, "how often offsets expire"
    ),
    Setting(
        "offsets.topic.segment.bytes",
        parse_positive,
        104_857_600,
        "segment size of __consumer_offsets when the topic sets no segment.bytes (small "
        "segments let the log cleaner compact it sooner)",
    ),
    Setting("log.cleaner.enable", parse_bool, True, "compact cleanup.policy=compact topics"),
    Setting(
        "log.cleaner.backoff.ms",
        parse_positive,
        15_000,
        "how long the log cleaner sleeps when no log needs cleaning",
    ),
    Setting(
        "log.cleaner.min.cleanable.ratio",
        _parse_ratio,
        0.5,
        "default min.cleanable.dirty.ratio: a log is cleaned once this share of its cleanable "
        "bytes is not yet compacted",
    ),
    Setting(
        "log.cleaner.delete.retention.ms",
        parse_non_negative,
        86_400_000,
        "default delete.retention.ms: how long a compacted topic keeps tombstones and "
        "finished transaction markers",
    ),
    Setting(
        "log.segment.bytes",
        parse_positive,
        1 << 30,
        "default segment.bytes: a partition log rolls a new segment at this size",
    ),
    Setting(
        "connections.max.idle.ms",
        int,
        600_000,
        "close a Kafka connection with no request started for this long",
    ),
    Setting(
        "request.read.timeout.ms",
        int,
        30_000,
        "a started Kafka request must arrive whole within this (slow senders are closed)",
    ),
    Setting("max.connections", int, 10_000, "Kafka connections per listener; more are refused"),
    Setting(
        "message.max.bytes",
        int,
        1_048_588,
        "largest record batch a produce may carry (topic override: max.message.bytes)",
    ),
    Setting(
        "auto.create.topics.enable",
        parse_bool,
        True,
        "Metadata for an unknown topic creates it (num.partitions, default.replication.factor)",
    ),
    Setting(
        "socket.request.max.bytes",
        int,
        104_857_600,
        "largest Kafka request frame; a bigger one closes the connection unread",
    ),
    Setting(
        "sasl.server.max.receive.size",
        parse_positive,
        524_288,
        "on a SASL listener, before authentication, a request frame announcing more bytes "
        "than this closes the connection before it is read",
    ),
    Setting(
        "connections.max.preauth.ms",
        parse_positive,
        10_000,
        "a connection to a SASL listener that has not authenticated within this is closed "
        "(connections.max.idle.ms applies after login)",
    ),
    Setting(
        "inter.broker.listener.name",
        str,
        "",
        "the listener followers fetch from (default: the first of listeners); any security "
        "protocol: followers log in to SASL listeners as this broker's own user",
    ),
    Setting(
        "replication.only.listeners",
        str,
        "",
        "listener names that serve only follower replication (ApiVersions, SASL, "
        "OffsetForLeaderEpoch, a replica's Fetch), nothing to clients",
    ),
    Setting(
        "replication.principals",
        str,
        "User:broker",
        "on an authenticating replication-only listener, the principals allowed to replicate "
        "(comma-separated)",
    ),
    Setting(
        "listener.security.protocol.map",
        str,
        "",
        "NAME:PROTOCOL,... for listeners not named "
        "after their protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)",
    ),
    Setting(
        "ssl.certificate.location", str, "", "PEM certificate chain of an SSL/SASL_SSL listener"
    ),
    Setting("ssl.key.location", str, "", "PEM private key of an SSL/SASL_SSL listener"),
    Setting("ssl.client.auth", str, "none", "none | requested | required (mutual TLS)"),
    Setting("ssl.ca.location", str, "", "PEM CA certificates that sign client certificates"),
    Setting(
        "sasl.enabled.mechanisms", str, "PLAIN", "SASL mechanisms of a SASL_* listener (PLAIN only)"
    ),
    Setting(
        "sasl.plain.users.file",
        str,
        "",
        "hashed SASL/PLAIN users (python -m kraft.rpc.auth add-user FILE NAME)",
    ),
    Setting(
        CLIENT_CREDENTIALS_KEY,
        str,
        "",
        "RPC credentials file (username=/password= lines) for "
        "controllers that require authentication",
    ),
]


@dataclass(frozen=True)
class BrokerConfig:
    """A broker node's settings, validated."""

    values: dict[str, Any]
    node_id: int
    cluster_id: str
    listener: tuple[str, str, int]
    advertised: tuple[str, str, int]
    log_dirs: list[Path]
    bootstrap: list[tuple[str, int]]
    rack: str | None
    rpc_client_credentials: ClientCredentials | None = field(default=None, repr=False)
    # every listener (name, host, port) and what each advertises; ``listener``/``advertised``
    # are the first of them (the one that answers the broker's admin endpoint)
    listeners: tuple[tuple[str, str, int], ...] = ()
    advertised_listeners: tuple[tuple[str, str, int], ...] = ()

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> BrokerConfig:
        v = resolve_settings(props, BROKER_SETTINGS, "broker")
        if v["process.roles"] != "broker":
            raise ConfigError("process.roles must be 'broker' for a broker node")
        listeners = tuple(
            parse_listener(x.strip(), "listeners") for x in v["listeners"].split(",") if x.strip()
        )
        if not listeners:
            raise ConfigError("listeners: no listener given")
        names = [n for n, _, _ in listeners]
        if len(set(names)) != len(names):
            raise ConfigError(f"listeners: names must be unique, got {names}")
        given = {
            n: (n, h, p)
            for n, h, p in (
                parse_listener(x.strip(), "advertised.listeners")
                for x in v["advertised.listeners"].split(",")
                if x.strip()
            )
        }
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise ConfigError(f"advertised.listeners: {unknown} are not in listeners {names}")
        advertised_all = tuple(given.get(n, (n, h, p)) for n, h, p in listeners)
        inter = v["inter.broker.listener.name"]
        if inter and inter not in names:
            raise ConfigError(
                f"inter.broker.listener.name: {inter!r} is not one of the listeners {names}"
            )
        repl_only = [x.strip() for x in v["replication.only.listeners"].split(",") if x.strip()]
        if set(repl_only) - set(names):
            raise ConfigError(
                f"replication.only.listeners: {sorted(set(repl_only) - set(names))} are not "
                f"among the listeners {names}"
            )
        listener, advertised = listeners[0], advertised_all[0]
        log_dirs = [Path(p.strip()) for p in v["log.dirs"].split(",") if p.strip()]
        if not log_dirs:
            raise ConfigError("log.dirs: no directory given")
        bootstrap = parse_hostports(
            v["controller.quorum.bootstrap.servers"], "controller.quorum.bootstrap.servers"
        )
        return cls(
            v,
            v["node.id"],
            v["cluster.id"],
            listener,
            advertised,
            log_dirs,
            bootstrap,
            v["broker.rack"] or None,
            client_credentials(v[CLIENT_CREDENTIALS_KEY]),
            listeners,
            advertised_all,
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BrokerConfig:
        return cls.from_properties(load_properties(path))

    def __getitem__(self, key: str) -> Any:
        return self.values[key]
