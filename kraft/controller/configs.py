"""Config definitions (types, defaults, validators) for topics and dynamic broker configs.

Values are stored as strings, as Kafka does. :func:`validate_value` checks one value against its
definition and returns its canonical string (lists joined with ',', booleans lower-case,
surrounding blanks dropped); a bad key or value raises ``INVALID_CONFIG`` naming the key and the
rule. Topic configs may have a broker *synonym*: a cluster-wide dynamic broker config (resource
name "") that supplies the topic's default when the topic does not override it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kraft.errors import ErrorCode, KraftError
from kraft.records import RESOURCE_BROKER, RESOURCE_TOPIC

BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = "boolean", "string", "int", "long", "double", "list"
INT_MAX, LONG_MAX = 2**31 - 1, 2**63 - 1
_RANGES = {INT: (-(2**31), INT_MAX), LONG: (-(2**63), LONG_MAX)}

# A rule checks a parsed value; it returns None when the value is fine, else the rule in words.
Rule = Callable[[Any], "str | None"]


def at_least(minimum: int) -> Rule:
    return lambda v: None if v >= minimum else f"must be at least {minimum}"


def between(low: float, high: float) -> Rule:
    return lambda v: None if low <= v <= high else f"must be between {low} and {high}"


def one_of(*choices: str) -> Rule:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}"


def items_of(*choices: str) -> Rule:
    def check(items: list[str]) -> str | None:
        if not items:
            return f"must list at least one of {', '.join(choices)}"
        bad = [i for i in items if i not in choices]
        if bad:
            return f"may only contain {', '.join(choices)} (got {', '.join(bad)})"
        if len(set(items)) != len(items):
            return "must not repeat a value"
        return None

    return check


@dataclass(frozen=True, slots=True)
class ConfigDef:
    """One config key: its type, default (as a string), rule, and broker synonym if any."""

    name: str
    type: str
    default: str
    rule: Rule | None = None
    synonym: str | None = None
    doc: str = ""

    @property
    def is_list(self) -> bool:
        return self.type == LIST


def _defs(*defs: ConfigDef) -> dict[str, ConfigDef]:
    return {d.name: d for d in defs}


_MAX = str(LONG_MAX)
_COMPRESSION = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
_TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")

TOPIC_CONFIGS: Mapping[str, ConfigDef] = _defs(
    ConfigDef(
        "cleanup.policy",
        LIST,
        "delete",
        items_of("delete", "compact"),
        "log.cleanup.policy",
        "delete old segments, compact by key, or both",
    ),
    ConfigDef("compression.type", STRING, "producer", one_of(*_COMPRESSION), "compression.type"),
    ConfigDef(
        "delete.retention.ms", LONG, "86400000", at_least(0), "log.cleaner.delete.retention.ms"
    ),
    ConfigDef("file.delete.delay.ms", LONG, "60000", at_least(0)),
    ConfigDef("flush.messages", LONG, _MAX, at_least(1), "log.flush.interval.messages"),
    ConfigDef("flush.ms", LONG, _MAX, at_least(0)),
    ConfigDef("index.interval.bytes", INT, "4096", at_least(0)),
    ConfigDef("max.compaction.lag.ms", LONG, _MAX, at_least(1)),
    ConfigDef("max.message.bytes", INT, "1048588", at_least(0), "message.max.bytes"),
    ConfigDef(
        "message.timestamp.type",
        STRING,
        "CreateTime",
        one_of(*_TIMESTAMP_TYPES),
        "log.message.timestamp.type",
    ),
    ConfigDef("message.timestamp.before.max.ms", LONG, _MAX, at_least(0)),
    ConfigDef("message.timestamp.after.max.ms", LONG, _MAX, at_least(0)),
    ConfigDef("min.cleanable.dirty.ratio", DOUBLE, "0.5", between(0, 1)),
    ConfigDef("min.compaction.lag.ms", LONG, "0", at_least(0)),
    ConfigDef("min.insync.replicas", INT, "1", at_least(1), "min.insync.replicas"),
    ConfigDef("preallocate", BOOLEAN, "false"),
    ConfigDef("retention.bytes", LONG, "-1", None, "log.retention.bytes"),
    ConfigDef("retention.ms", LONG, "604800000", at_least(-1), "log.retention.ms"),
    ConfigDef("segment.bytes", INT, "1073741824", at_least(14), "log.segment.bytes"),
    ConfigDef("segment.index.bytes", INT, "10485760", at_least(4)),
    ConfigDef("segment.jitter.ms", LONG, "0", at_least(0)),
    ConfigDef("segment.ms", LONG, "604800000", at_least(1), "log.roll.ms"),
    ConfigDef(
        "unclean.leader.election.enable", BOOLEAN, "false", None, "unclean.leader.election.enable"
    ),
)

BROKER_CONFIGS: Mapping[str, ConfigDef] = _defs(
    ConfigDef("background.threads", INT, "10", at_least(1)),
    ConfigDef("compression.type", STRING, "producer", one_of(*_COMPRESSION)),
    ConfigDef("log.cleaner.delete.retention.ms", LONG, "86400000", at_least(0)),
    ConfigDef("log.cleaner.threads", INT, "1", at_least(0)),
    ConfigDef("log.cleanup.policy", LIST, "delete", items_of("delete", "compact")),
    ConfigDef("log.flush.interval.messages", LONG, _MAX, at_least(1)),
    ConfigDef("log.message.timestamp.type", STRING, "CreateTime", one_of(*_TIMESTAMP_TYPES)),
    ConfigDef("log.retention.bytes", LONG, "-1"),
    ConfigDef("log.retention.ms", LONG, "604800000", at_least(-1)),
    ConfigDef("log.roll.ms", LONG, "604800000", at_least(1)),
    ConfigDef("log.segment.bytes", INT, "1073741824", at_least(14)),
    ConfigDef("message.max.bytes", INT, "1048588", at_least(0)),
    ConfigDef("min.insync.replicas", INT, "1", at_least(1)),
    ConfigDef("num.io.threads", INT, "8", at_least(1)),
    ConfigDef("num.network.threads", INT, "3", at_least(1)),
    ConfigDef("num.replica.fetchers", INT, "1", at_least(1)),
    ConfigDef("unclean.leader.election.enable", BOOLEAN, "false"),
)

RESOURCE_TYPES: Mapping[str, int] = {"topic": RESOURCE_TOPIC, "broker": RESOURCE_BROKER}
RESOURCE_TYPE_NAMES: Mapping[int, str] = {v: k for k, v in RESOURCE_TYPES.items()}


def config_defs(resource_type: int) -> Mapping[str, ConfigDef]:
    return TOPIC_CONFIGS if resource_type == RESOURCE_TOPIC else BROKER_CONFIGS


def lookup(resource_type: int, key: object) -> ConfigDef:
    """The definition of ``key``, or INVALID_CONFIG if the resource type has no such config."""
    defs = config_defs(resource_type)
    d = defs.get(key) if isinstance(key, str) else None
    if d is None:
        kind = RESOURCE_TYPE_NAMES.get(resource_type, str(resource_type))
        raise KraftError(ErrorCode.INVALID_CONFIG, f"Unknown {kind} config name: {key!r}")
    return d


def split_list(value: str | None) -> list[str]:
    """Items of a list-typed value ("a, b" → ["a", "b"]); None or blank → []."""
    if value is None:
        return []
    return [item.strip() for item in value.split(",") if item.strip()]


def join_list(items: list[str]) -> str:
    return ",".join(items)


def _parse(d: ConfigDef, raw: str) -> tuple[Any, str]:
    """Parse ``raw`` by type; returns (parsed value, canonical string) or raises ValueError."""
    text = raw.strip()
    if d.type == BOOLEAN:
        if text.lower() not in ("true", "false"):
            raise ValueError("must be true or false")
        return text.lower() == "true", text.lower()
    if d.type in (INT, LONG):
        try:
            n = int(text, 10)
        except ValueError:
            raise ValueError(f"must be an integer ({d.type})") from None
        low, high = _RANGES[d.type]
        if not low <= n <= high:
            raise ValueError(f"must fit in a {d.type} ({low}..{high})")
        return n, str(n)
    if d.type == DOUBLE:
        try:
            x = float(text)
        except ValueError:
            raise ValueError("must be a number") from None
        if not math.isfinite(x):
            raise ValueError("must be a finite number")
        return x, text
    if d.type == LIST:
        items = split_list(text)
        return items, join_list(items)
    return text, text


def validate_value(resource_type: int, key: object, value: object) -> str:
    """Check ``value`` for ``key``; return its canonical string or raise INVALID_CONFIG."""
    d = lookup(resource_type, key)
    if not isinstance(value, str):
        raise KraftError(
            ErrorCode.INVALID_CONFIG,
            f"Invalid value {value!r} for configuration {d.name}: the value must be a string",
        )
    try:
        parsed, canonical = _parse(d, value)
    except ValueError as e:
        raise KraftError(
            ErrorCode.INVALID_CONFIG, f"Invalid value {value!r} for configuration {d.name}: {e}"
        ) from None
    problem = d.rule(parsed) if d.rule is not None else None
    if problem is not None:
        raise KraftError(
            ErrorCode.INVALID_CONFIG,
            f"Invalid value {value!r} for configuration {d.name}: value {problem}",
        )
    return canonical


def static_default(d: ConfigDef, unclean_default: bool) -> str:
    """The built-in default of a config; ``unclean.leader.election.enable`` follows the
    controller's shared setting."""
    if d.name == "unclean.leader.election.enable":
        return "true" if unclean_default else "false"
    return d.default


def is_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() == "true"
