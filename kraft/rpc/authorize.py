"""Who may call what on the controller RPC (pure: no I/O).

With authentication on, the broker APIs (registration, heartbeats, ISR changes, controlled
shutdown, producer-id blocks, unregistration) are refused with ``CLUSTER_AUTHORIZATION_FAILED``
unless the caller is one of the configured broker principals (``controller.rpc.broker.principals``):
an admin's or a user's credentials cannot fence or unregister a broker.

A broker forwarding a Kafka client's admin request names that client in the envelope field
``on_behalf_of``; the request then runs as that principal (records carry it). Only a broker
principal may set it, never to an anonymous principal, and never on a broker API.
"""

from __future__ import annotations

from kraft.errors import ErrorCode, KraftError

BROKER_APIS = frozenset(
    {
        "BrokerRegistration",
        "BrokerHeartbeat",
        "UnregisterBroker",
        "AlterPartition",
        "ControlledShutdown",
        "BeginControlledShutdown",
        "AllocateProducerIds",
    }
)
ANONYMOUS_PRINCIPALS = frozenset({"User:ANONYMOUS", "ANONYMOUS", ""})
DEFAULT_BROKER_PRINCIPALS = frozenset({"User:broker"})


def parse_principals(value: str) -> frozenset[str]:
    """``User:a,User:b`` → the set (blank entries dropped)."""
    return frozenset(p.strip() for p in value.split(",") if p.strip())


def effective_principal(
    api: str,
    principal: str,
    on_behalf_of: object,
    *,
    auth_enabled: bool,
    broker_principals: frozenset[str] = DEFAULT_BROKER_PRINCIPALS,
) -> str:
    """The principal ``api`` runs as, or ``KraftError(CLUSTER_AUTHORIZATION_FAILED)``."""
    is_broker = principal in broker_principals
    if on_behalf_of is not None:
        if not isinstance(on_behalf_of, str):
            raise KraftError(ErrorCode.INVALID_REQUEST, "on_behalf_of must be a string")
        if auth_enabled and not is_broker:
            raise KraftError(
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                f"{principal} may not act on behalf of another principal (brokers only)",
            )
        if api in BROKER_APIS:
            raise KraftError(
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                f"{api} cannot be called on behalf of a client",
            )
        if auth_enabled and on_behalf_of in ANONYMOUS_PRINCIPALS:
            raise KraftError(
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "the controllers require authentication: an anonymous Kafka client's request "
                "is not forwarded",
            )
        return on_behalf_of
    if auth_enabled and api in BROKER_APIS and not is_broker:
        raise KraftError(
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            f"{api} is a broker API: {principal} is not a broker principal",
        )
    return principal
