"""Kafka's topic name rules.

Legal characters ``[a-zA-Z0-9._-]``, at most 249 characters, not ``.`` or ``..``. Because ``.``
and ``_`` collide in metric names, two topics whose names differ only by those characters
cannot coexist.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable

from kraft.errors import ErrorCode, KraftError

MAX_NAME_LENGTH = 249
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")
_MAX_VARIANT_BITS = 10  # beyond 2**10 spellings, scan the existing names instead


def validate_topic_name(name: object) -> str:
    """Return ``name`` if it is a legal topic name, else raise INVALID_TOPIC_EXCEPTION."""
    if not isinstance(name, str) or name == "":
        raise KraftError(
            ErrorCode.INVALID_TOPIC_EXCEPTION, "Topic name is illegal, it can't be empty."
        )
    if name in (".", ".."):
        raise KraftError(ErrorCode.INVALID_TOPIC_EXCEPTION, f'Topic name cannot be "{name}".')
    if len(name) > MAX_NAME_LENGTH:
        raise KraftError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"Topic name is illegal, it can't be longer than {MAX_NAME_LENGTH} characters, "
            f"topic name: {name[:40]}... ({len(name)} characters)",
        )
    if not _LEGAL.fullmatch(name):
        raise KraftError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"Topic name '{name}' is illegal, it contains a character other than "
            "ASCII alphanumerics, '.', '_' and '-'",
        )
    return name


def has_collision_chars(name: str) -> bool:
    return "." in name or "_" in name


def unify_collision_chars(name: str) -> str:
    """The metric-name form: '.' becomes '_'."""
    return name.replace(".", "_")


def find_collision(
    name: str, exists: Callable[[str], bool], all_names: Callable[[], Iterable[str]]
) -> str | None:
    """An existing name that differs from ``name`` only by '.' vs '_', or None.

    Tries every '.'/'_' spelling of ``name`` with ``exists`` (cheap for usual names); names with
    many such characters fall back to scanning ``all_names()``.
    """
    if not has_collision_chars(name):
        return None
    positions = [i for i, c in enumerate(name) if c in "._"]
    if len(positions) > _MAX_VARIANT_BITS:
        key = unify_collision_chars(name)
        for other in sorted(all_names()):
            if other != name and unify_collision_chars(other) == key:
                return other
        return None
    chars = list(name)
    for combo in itertools.product("._", repeat=len(positions)):
        for pos, c in zip(positions, combo):
            chars[pos] = c
        candidate = "".join(chars)
        if candidate != name and exists(candidate):
            return candidate
    return None


def collision_error(name: str, other: str) -> KraftError:
    return KraftError(
        ErrorCode.INVALID_TOPIC_EXCEPTION,
        f"Topic '{name}' collides with existing topic '{other}': names that differ only "
        "by '.' and '_' cannot coexist (they map to the same metric name).",
    )
