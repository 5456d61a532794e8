"""Broker lifecycle: registration, heartbeats, fencing states, controlled shutdown.

States (kraft-reference §8.6): NOT_RUNNING → STARTING (registered, catching up) → RECOVERY
(the controller says we are caught up; local logs are being opened) → RUNNING (unfenced) →
PENDING_CONTROLLED_SHUTDOWN → SHUTTING_DOWN.

* Registration uses one incarnation id (uuid4) per process and is retried with backoff while
  no controller answers. ``INCONSISTENT_CLUSTER_ID`` is fatal; ``DUPLICATE_BROKER_REGISTRATION``
  (our previous process's session is still alive) is retried until it expires.
* Heartbeats carry the broker epoch and the last applied metadata offset, every
  ``broker.heartbeat.interval.ms``. The client follows the active controller across failovers;
  the broker re-registers only when a controller answers ``STALE_BROKER_EPOCH`` or
  ``BROKER_ID_NOT_REGISTERED``.
* Following the quorum, not a socket: a controller gets a quarter of the session timeout
  (0.5-3 s) to answer a heartbeat; after that the client drops it as suspect and asks the others,
  whose NOT_CONTROLLER answers name the current leader, and a failed heartbeat is retried at
  once. So a stalled or SIGSTOPped active controller costs a broker about one attempt timeout,
  well inside the full session the new active controller gives every broker on activation.
* ``want_fence`` stays true until the first metadata image has been published to the replica
  manager (``ready`` event), then the controller unfences us and we are RUNNING.
* Controlled shutdown: heartbeat ``want_shutdown`` until the controller answers
  ``should_shut_down`` or the deadline passes.
* Offline log dirs (KIP-858): every heartbeat carries ``offline_report()`` (the offline dirs'
  ids and paths and the replicas on them) once a log dir has failed, until the broker restarts.
* Image checks: while ``image_mismatch()`` reports a divergence, every heartbeat carries it,
  and ``want_fence`` is true again once it says ``fenced`` (the image still differed after a
  reload), until a check agrees.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable
from typing import Any

import trio

from kraft.errors import ErrorCode, KraftError

log = logging.getLogger(__name__)


class BrokerState(enum.Enum):
    NOT_RUNNING = "NOT_RUNNING"
    STARTING = "STARTING"
    RECOVERY = "RECOVERY"
    RUNNING = "RUNNING"
    PENDING_CONTROLLED_SHUTDOWN = "PENDING_CONTROLLED_SHUTDOWN"
    SHUTTING_DOWN = "SHUTTING_DOWN"


class FatalBrokerError(Exception):
    """The broker cannot continue (e.g. it belongs to another cluster)."""


_REREGISTER = {ErrorCode.STALE_BROKER_EPOCH, ErrorCode.BROKER_ID_NOT_REGISTERED}


class BrokerLifecycle:
    """Drives registration and heartbeats against the controllers."""

    def __init__(
        self,
        client: Any,
        broker_id: int,
        cluster_id: str,
        listeners: list[dict[str, Any]],
        rack: str | None,
        metadata_offset: Callable[[], int],
        *,
        heartbeat_interval: float = 2.0,
        session_timeout: float = 9.0,
        registration_timeout: float = 60.0,
        features: list[dict[str, Any]] | None = None,
        offline_report: Callable[[], dict[str, Any]] | None = None,
        image_mismatch: Callable[[], dict[str, Any] | None] | None = None,
        previous_epoch: Callable[[], int] | None = None,
        record_epoch: Callable[[int], object] | None = None,
    ) -> None:
        self.client = client
        self.broker_id = broker_id
        self.cluster_id = cluster_id
        self.listeners = listeners
        self.rack = rack
        self.metadata_offset = metadata_offset
        self.heartbeat_interval = heartbeat_interval
        self.session_timeout = session_timeout
        self.registration_timeout = registration_timeout
        self.features = features or [
            {"name": "metadata.version", "min_version": 1, "max_version": 1000}
        ]
        self.offline_report = offline_report
        self.incarnation_id = str(uuid.uuid4())
        self.broker_epoch = -1
        self.state = BrokerState.NOT_RUNNING
        self.ready = trio.Event()  # set by the node once the replica manager has its first image
        self.running = trio.Event()
        self.shutdown_complete = trio.Event()
        self._want_shutdown = False
        self._wakeup = trio.Event()
        self.last_heartbeat: dict[str, Any] | None = None
        self.registrations = 0
        self.attempt_timeout = min(3.0, max(0.5, session_timeout / 4))
        self.image_mismatch = image_mismatch or (lambda: None)
        # the epoch this broker's disks were last registered with (-1: none proven), and where a
        # new one is recorded (broker.broker_epoch)
        self.previous_epoch = previous_epoch or (lambda: -1)
        self.record_epoch = record_epoch

    def _set_state(self, state: BrokerState, why: str) -> None:
        if state != self.state:
            log.info(
                "broker %d (epoch %d): %s -> %s (%s)",
                self.broker_id,
                self.broker_epoch,
                self.state.value,
                state.value,
                why,
            )
            self.state = state
            if state == BrokerState.RUNNING:
                self.running.set()

    # ---- registration ----------------------------------------------------------------------
    async def register(self) -> None:
        """Register (retrying with backoff) until a controller assigns a broker epoch."""
        deadline = trio.current_time() + self.registration_timeout
        backoff = 0.1
        body = {
            "broker_id": self.broker_id,
            "cluster_id": self.cluster_id,
            "incarnation_id": self.incarnation_id,
            "listeners": self.listeners,
            "rack": self.rack,
            "features": self.features,
            "previous_broker_epoch": await trio.to_thread.run_sync(self.previous_epoch),
        }
        while True:
            try:
                resp = await self.client.call(
                    "BrokerRegistration",
                    body,
                    timeout=max(1.0, min(5.0, self.session_timeout / 2)),
                    attempt_timeout=self.attempt_timeout,
                )
            except KraftError as e:
                if e.code == ErrorCode.INCONSISTENT_CLUSTER_ID:
                    raise FatalBrokerError(f"registration refused: {e}") from None
                if trio.current_time() + backoff > deadline:
                    raise FatalBrokerError(
                        f"could not register within {self.registration_timeout:.0f}s "
                        f"(last error: {e})"
                    ) from None
                log.warning(
                    "broker %d: registration failed (%s); retrying in %.1fs",
                    self.broker_id,
                    e,
                    backoff,
                )
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            self.broker_epoch = int(resp["broker_epoch"])
            self.registrations += 1
            if self.record_epoch is not None:
                await trio.to_thread.run_sync(self.record_epoch, self.broker_epoch)
            log.info(
                "broker %d registered: incarnation %s, broker epoch %d",
                self.broker_id,
                self.incarnation_id,
                self.broker_epoch,
            )
            self._set_state(BrokerState.STARTING, "registered")
            return

    # ---- heartbeats ------------------------------------------------------------------------
    async def run(self) -> None:
        """Register, then heartbeat until controlled shutdown completes (then return)."""
        await self.register()
        while True:
            want_shutdown = self._want_shutdown
            mismatch = self.image_mismatch()
            diverged = mismatch is not None and bool(mismatch.get("fenced"))
            body: dict[str, Any] = {
                "broker_id": self.broker_id,
                "broker_epoch": self.broker_epoch,
                "metadata_offset": self.metadata_offset(),
                "want_fence": (not self.ready.is_set() or diverged) and not want_shutdown,
                "want_shutdown": want_shutdown,
            }
            if self.offline_report is not None:
                body.update(self.offline_report())
            if mismatch is not None:
                body["image_mismatch"] = mismatch
            try:
                resp = await self.client.call(
                    "BrokerHeartbeat",
                    body,
                    timeout=max(1.0, self.session_timeout / 2),
                    attempt_timeout=self.attempt_timeout,
                )
            except KraftError as e:
                if e.code in _REREGISTER:
                    log.warning(
                        "broker %d: controller says %s for epoch %d; re-registering",
                        self.broker_id,
                        e.code.name,
                        self.broker_epoch,
                    )
                    self.ready_for_reregistration()
                    await self.register()
                    continue
                log.warning("broker %d: heartbeat failed: %s", self.broker_id, e)
                failed = True
            else:
                failed = False
                self.last_heartbeat = resp
                if self._on_heartbeat(resp, want_shutdown):
                    return
            interval = self.heartbeat_interval
            if (
                failed
                or self._want_shutdown
                or self.state
                in (
                    BrokerState.STARTING,
                    BrokerState.RECOVERY,
                )
            ):
                interval = min(interval, 0.25)
            with trio.move_on_after(interval):
                await self._wakeup.wait()
            self._wakeup = trio.Event()

    def ready_for_reregistration(self) -> None:
        """A new registration means a new epoch: we are fenced again until caught up."""
        self._set_state(BrokerState.STARTING, "re-registering")

    def _on_heartbeat(self, resp: dict[str, Any], want_shutdown: bool) -> bool:
        """Advance the state from a heartbeat answer; True when shutdown may proceed."""
        if want_shutdown and resp.get("should_shut_down"):
            self._set_state(BrokerState.SHUTTING_DOWN, "controller allowed shutdown")
            self.shutdown_complete.set()
            return True
        if want_shutdown:
            return False
        if self.state == BrokerState.STARTING and resp.get("is_caught_up"):
            self._set_state(BrokerState.RECOVERY, "caught up with the metadata log")
        if self.state == BrokerState.RECOVERY and not resp.get("is_fenced", True):
            self._set_state(BrokerState.RUNNING, "unfenced")
        elif self.state == BrokerState.RUNNING and resp.get("is_fenced"):
            self._set_state(BrokerState.RECOVERY, "fenced by the controller")
        return False

    def poke(self) -> None:
        """Send the next heartbeat now (e.g. once ready)."""
        self._wakeup.set()

    async def controlled_shutdown(self, timeout: float) -> bool:
        """Ask to shut down; wait for permission up to ``timeout`` s. True if granted."""
        if self.state == BrokerState.NOT_RUNNING or self.broker_epoch < 0:
            return False
        self._want_shutdown = True
        self._set_state(BrokerState.PENDING_CONTROLLED_SHUTDOWN, "shutdown requested")
        self.poke()
        with trio.move_on_after(timeout):
            await self.shutdown_complete.wait()
            return True
        log.warning(
            "broker %d: controlled shutdown not confirmed within %.1fs; shutting down anyway",
            self.broker_id,
            timeout,
        )
        self._set_state(BrokerState.SHUTTING_DOWN, "controlled shutdown deadline passed")
        return False
