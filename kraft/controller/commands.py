"""A controller request as its handler sees it, and the result the handler produces.

A :class:`Command` is one client (or controller-internal) write request on the active
controller: the API name and body, who asked, the time it was stamped and a random ``seed``
(topic ids and placement randomness derive from it, so a handler is a pure function of its
inputs and tests can fix them). Since controller v2 a command is never replicated: only the
active controller runs handlers, and what goes through Raft is the record batch they produce.

A :class:`ControllerResult` is what a request handler returns: the records to append as one
batch (possibly none), the response body, and the ``reason`` written into the batch provenance.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

from kraft.errors import ErrorCode, KraftError
from kraft.records import Record


@dataclass(frozen=True, slots=True)
class Command:
    """One write request on the active controller (see docs/design.md, "Controller state machine")."""

    api: str
    body: dict[str, Any]
    request_id: str = ""
    principal: str = "ANONYMOUS"
    client_id: str = ""
    timestamp_ms: int = 0
    seed: int = 0
    leader_id: int = -1


def derive_int(seed: int, *parts: str) -> int:
    """A 64-bit integer derived from ``seed`` and ``parts`` (no use of Python's salted hash())."""
    h = hashlib.sha256(str(seed).encode())
    for part in parts:
        h.update(b"\x00" + part.encode())
    return int.from_bytes(h.digest()[:8], "big")


def derive_rng(seed: int, *parts: str) -> random.Random:
    """A private, reproducible random generator for one purpose (e.g. placing one topic)."""
    return random.Random(derive_int(seed, *parts))


@dataclass(slots=True)
class ControllerResult:
    """Records to append atomically, the response body, and the provenance reason."""

    records: list[Record] = field(default_factory=list)
    response: dict[str, Any] = field(default_factory=dict)
    reason: str = "user-request"
    # Where a stepped broker transition resumes (``election.Resume``: pass, topic name, partition
    # id of the next partition to examine, topics and partitions left for the second pass); the
    # active controller hands it to the next step if nothing was written since.
    pending: tuple[int, str, int, tuple[tuple[str, tuple[int, ...]], ...]] | None = None


def error_fields(error: KraftError | None = None) -> dict[str, Any]:
    """The ``error_code`` / ``error_message`` pair of a response item (0 / "" on success)."""
    if error is None:
        return {"error_code": 0, "error_message": ""}
    return {"error_code": int(error.code), "error_message": error.message or error.code.name}


def error_response(code: ErrorCode, message: str) -> dict[str, Any]:
    """A top-level error response body."""
    return {"error_code": int(code), "error_message": message}
