"""A stand-in for what ``kraft.broker_lifecycle.BrokerLifecycle`` uses of ``ControllerServer``,
writing through a real ``QuorumStateMachine`` (the server's step loop without Raft), for unit
tests of the lifecycle's bookkeeping on a real image."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import trio

from kraft.controller.commands import Command
from kraft.controller.settings import ControllerSettings
from kraft.controller.state_machine import QuorumStateMachine
from kraft.errors import ErrorCode, KraftError

LISTENER = {
    "name": "PLAINTEXT",
    "host": "127.0.0.1",
    "port": 9092,
    "security_protocol": "PLAINTEXT",
}
FEATURES = [{"name": "metadata.version", "min_version": 1, "max_version": 2}]


def registration(broker_id: int, cluster_id: str = "c") -> dict[str, Any]:
    """A BrokerRegistration body for ``broker_id`` (its incarnation id derived from it)."""
    return {
        "broker_id": broker_id,
        "cluster_id": cluster_id,
        "incarnation_id": str(uuid.UUID(int=broker_id)),
        "listeners": [LISTENER],
        "rack": None,
        "features": FEATURES,
    }


class StateMachineServer:
    """What ``BrokerLifecycle`` uses of ``ControllerServer``, writing through a real
    ``QuorumStateMachine``; a stepped transition is repeated until complete, as ``submit``
    does. ``cut_after`` stops an UnfenceBroker after that many steps (a failover); while
    ``hold`` is set and not yet fired, a stepped transition waits for it after its first step."""

    def __init__(self, settings: ControllerSettings) -> None:
        self.state_machine = QuorumStateMachine(settings)
        self.node_id, self.is_active = 1, True
        self.log = SimpleNamespace(next_offset=0)
        self.cut_after: int | None = None
        self.commands: list[dict[str, Any]] = []
        self.hold: trio.Event | None = None
        self._n = 0

    async def submit(self, api: str, body: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        steps = 0
        while True:
            if self.cut_after is not None and api == "UnfenceBroker" and steps == self.cut_after:
                raise KraftError(ErrorCode.NOT_CONTROLLER, "leadership lost before commit")
            self._n += 1
            self.commands.append({"api": api, **body})
            batch, response, _ = self.state_machine.propose(
                Command(api=api, body=body, request_id=f"r{self._n}", timestamp_ms=self._n, seed=1),
                1,
            )
            if response.get("error_code"):
                raise KraftError(
                    ErrorCode(response["error_code"]), response.get("error_message", "")
                )
            self.log.next_offset = self.state_machine.image.offset + 1
            steps += 1
            if not response.get("incomplete"):
                return response
            if self.hold is not None:
                await self.hold.wait()
            if api == "UnfenceBroker":
                body = dict(body, **{"continue": True})

    @property
    def speculative(self) -> QuorumStateMachine:
        """The state machine proposals are built on (here the committed one itself)."""
        return self.state_machine

    def image(self) -> Any:
        return self.state_machine.image


async def activate_with_brokers(server: StateMachineServer, brokers: tuple[int, ...]) -> None:
    """Node 1 becomes the active controller and ``brokers`` register (still fenced)."""
    await server.submit("ActivateController", {"leader_id": 1, "term": 1})
    for b in brokers:
        await server.submit("BrokerRegistration", registration(b))
