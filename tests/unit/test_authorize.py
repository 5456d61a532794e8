"""Who may call what on the controller RPC (kraft.rpc.authorize)."""

from __future__ import annotations

import pytest

from kraft.errors import ErrorCode, KraftError
from kraft.rpc.authorize import BROKER_APIS, effective_principal, parse_principals

BROKERS = frozenset({"User:broker"})


def _refused(*args: object, **kwargs: object) -> ErrorCode:
    with pytest.raises(KraftError) as info:
        effective_principal(*args, **kwargs)  # type: ignore[arg-type]  # deliberately wrong arguments
    return info.value.code


@pytest.mark.parametrize("api", sorted(BROKER_APIS))
def test_broker_apis_need_a_broker_principal_with_auth(api: str) -> None:
    assert effective_principal(api, "User:broker", None, auth_enabled=True) == "User:broker"
    for who in ("User:admin", "User:controller", "User:ANONYMOUS"):
        code = _refused(api, who, None, auth_enabled=True, broker_principals=BROKERS)
        assert code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    # without authentication every caller is anonymous: nothing to tell apart
    assert effective_principal(api, "User:ANONYMOUS", None, auth_enabled=False) == "User:ANONYMOUS"


def test_on_behalf_of_only_from_brokers_for_authenticated_clients() -> None:
    ok = effective_principal("CreateTopics", "User:broker", "User:alice", auth_enabled=True)
    assert ok == "User:alice"
    assert (
        effective_principal("CreateTopics", "User:admin", None, auth_enabled=True) == "User:admin"
    )
    for principal, behalf, api in (
        ("User:admin", "User:alice", "CreateTopics"),
        ("User:broker", "User:ANONYMOUS", "DeleteTopics"),
        ("User:broker", "User:alice", "BrokerHeartbeat"),
    ):
        assert _refused(api, principal, behalf, auth_enabled=True) == (
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        )
    assert _refused("CreateTopics", "User:broker", 7, auth_enabled=True) == (
        ErrorCode.INVALID_REQUEST
    )


def test_parse_principals() -> None:
    assert parse_principals(" User:a, ,User:b ") == frozenset({"User:a", "User:b"})
