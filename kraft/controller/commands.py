"""The replicated command and the result a control manager produces from it.

A :class:`Command` is what the active controller submits to Raft: the client's API name and
request body, plus everything that makes applying it deterministic on every controller — the
time it was stamped, a random ``seed`` (topic ids and placement randomness derive from it), who
asked, and the id of the controller that stamped it. Its encoding is a msgpack map with a fixed
key order; decoding is strict.

A :class:`ControllerResult` is what a request handler returns: the records to append as one
batch (possibly none), the response body, and the ``reason`` written into the batch provenance.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

import msgpack

from kraft.errors import ErrorCode, KraftError
from kraft.records import Record
from kraft.slots import slot_init

_COMMAND_KEYS = (
    "api",
    "body",
    "request_id",
    "principal",
    "client_id",
    "timestamp_ms",
    "seed",
    "leader_id",
)
_COMMAND_TYPES = (str, dict, str, str, str, int, int, int)
_MAX_SEED = 2**64 - 1


class CommandDecodeError(ValueError):
    """Bytes that are not a well-formed command."""


@dataclass(frozen=True, slots=True)
class Command:
    """One replicated controller command (see docs/design.md, "Controller state machine")."""

    api: str
    body: dict[str, Any]
    request_id: str = ""
    principal: str = "ANONYMOUS"
    client_id: str = ""
    timestamp_ms: int = 0
    seed: int = 0
    leader_id: int = -1

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _COMMAND_KEYS}

    def encode(self) -> bytes:
        """Canonical msgpack bytes (keys in the fixed order above)."""
        packed: bytes = msgpack.packb(self.to_dict(), use_bin_type=True)
        return packed

    @classmethod
    def decode(cls, data: bytes) -> Command:
        """Strictly decode; raises :class:`CommandDecodeError` naming what is wrong."""
        try:
            d = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as e:  # msgpack raises several unrelated types
            raise CommandDecodeError(f"not a msgpack command: {e}") from None
        if not isinstance(d, dict) or tuple(d) != _COMMAND_KEYS:
            got = list(map(str, d)) if isinstance(d, dict) else type(d).__name__
            raise CommandDecodeError(
                f"a command must be a map with keys {list(_COMMAND_KEYS)}, got {got}"
            )
        values = tuple(d.values())  # in _COMMAND_KEYS order, the fields' order
        if tuple(map(type, values)) != _COMMAND_TYPES or not 0 <= values[6] <= _MAX_SEED:
            _explain(d)
        return cls(*values)


Command.__init__ = slot_init(Command)  # type: ignore[method-assign]  # one per applied command


def _explain(d: dict[str, Any]) -> None:
    """Raise the CommandDecodeError naming the first wrong field of a decoded command map."""
    for key in ("api", "request_id", "principal", "client_id"):
        if type(d[key]) is not str:
            raise CommandDecodeError(f"command {key} must be a string, got {d[key]!r}")
    for key in ("timestamp_ms", "seed", "leader_id"):
        if type(d[key]) is not int:
            raise CommandDecodeError(f"command {key} must be an integer, got {d[key]!r}")
    if not 0 <= d["seed"] <= _MAX_SEED:
        raise CommandDecodeError(
            f"command seed must be an unsigned 64-bit integer, got {d['seed']}"
        )
    raise CommandDecodeError(f"command body must be a map, got {type(d['body']).__name__}")


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
    # Where a stepped broker transition resumes: (topic name, partition id) of the next partition
    # to examine (the state machine hands it to the next step when nothing else happened since).
    pending: tuple[str, int] | None = None


def error_fields(error: KraftError | None = None) -> dict[str, Any]:
    """The ``error_code`` / ``error_message`` pair of a response item (0 / "" on success)."""
    if error is None:
        return {"error_code": 0, "error_message": ""}
    return {"error_code": int(error.code), "error_message": error.message or error.code.name}


def error_response(code: ErrorCode, message: str) -> dict[str, Any]:
    """A top-level error response body."""
    return {"error_code": int(code), "error_message": message}
