"""Kafka's error names and codes, and the exception that carries one.

Errors are values (a name + a message) at every boundary — RPC responses, CLI output — and
:class:`KraftError` inside the code. Codes are Kafka's own so that the broker can hand them
straight to Kafka clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from typing import Any


class ErrorCode(IntEnum):
    """Kafka error codes used by pykraft (a subset of Kafka's ``Errors`` enum)."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    BROKER_NOT_AVAILABLE = 8
    REPLICA_NOT_AVAILABLE = 9
    MESSAGE_TOO_LARGE = 10
    NETWORK_EXCEPTION = 13
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    INVALID_REQUEST = 42
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    POLICY_VIOLATION = 44
    SECURITY_DISABLED = 54
    SASL_AUTHENTICATION_FAILED = 58
    UNKNOWN_PRODUCER_ID = 59
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    CLUSTER_AUTHORIZATION_FAILED = 31
    TOPIC_AUTHORIZATION_FAILED = 29
    KAFKA_STORAGE_ERROR = 56
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    STALE_BROKER_EPOCH = 77
    OFFSET_NOT_AVAILABLE = 78
    PREFERRED_LEADER_NOT_AVAILABLE = 80
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
    ELECTION_NOT_NEEDED = 84
    UNKNOWN_TOPIC_ID = 100
    DUPLICATE_BROKER_REGISTRATION = 101
    BROKER_ID_NOT_REGISTERED = 102
    INCONSISTENT_TOPIC_ID = 103
    INCONSISTENT_CLUSTER_ID = 104
    THROTTLING_QUOTA_EXCEEDED = 89
    INVALID_UPDATE_VERSION = 95
    NEW_LEADER_ELECTED = 108
    INELIGIBLE_REPLICA = 107
    RESOURCE_NOT_FOUND = 91
    DUPLICATE_RESOURCE = 92


class KraftError(Exception):
    """An error with a Kafka error name, raised inside and turned into a value at boundaries.

    ``body`` is the error response's body: what a client needs beyond the code and message
    (NOT_CONTROLLER: where the leader is; a write refused after validation: its response items).
    Empty for most errors; on the wire it is the response's ``body``, unchanged in shape."""

    def __init__(
        self, code: ErrorCode, message: str = "", body: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(f"{code.name}: {message}" if message else code.name)
        self.code = code
        self.message = message
        self.body: dict[str, Any] = dict(body) if body else {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "error_code": int(self.code),
            "error": self.code.name,
            "error_message": self.message,
        }

    def to_response(self) -> dict[str, Any]:
        """The error's part of an RPC response: ``{error_code, error_message, body}``."""
        return {"error_code": int(self.code), "error_message": self.message, "body": self.body}


def error_name(code: int) -> str:
    """Kafka's name for an error code, or ``UNKNOWN(<code>)``."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"UNKNOWN({code})"
