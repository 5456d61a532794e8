"""The broker-lifecycle supervisor of the active controller: registration, heartbeats, sessions
and the fencing timer (Kafka's ``BrokerHeartbeatManager`` plus the parts of ``QuorumController``
that drive it).

The pure decisions are :class:`kraft.controller.heartbeats.BrokerHeartbeatManager`'s; this
module feeds it the clock and the image, submits the transitions it asks for through the
controller's write path, keeps a broker's session alive while its own transition is written,
and remembers each broker's fetch progress for DescribeQuorum's observers. Sessions are soft
state: a new active controller gives every registered broker a fresh one (:meth:`reset`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import trio

from kraft.controller.cluster_control import returning_disks
from kraft.controller.election import leaderless_isr_brokers
from kraft.controller.heartbeats import BrokerHeartbeatManager, HeartbeatDecision
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.image import MetadataImage
from kraft.metadata.image_check import BrokerImageTracker, Mismatch, TrackerEvent
from kraft.metadata.registrations import BrokerRegistration
from kraft.rpc.bodies import (
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    BrokerRegistrationRequest,
)

if TYPE_CHECKING:
    from kraft.controller_server import ControllerServer

log = logging.getLogger("kraft.controller")

SESSION_TIMER_INTERVAL_S = 0.1
# A broker's session is refreshed this often while a transition it asked for is written.
KEEP_ALIVE_INTERVAL_S = 1.0
# Topics per slice of the search for unfinished unfences (a yield to the event loop between).
SCAN_SLICE_TOPICS = 500
# A returning broker's expired session is left unfenced while it asked to register within this.
RETURNING_GRACE_S = 5.0
# A resumed unfence failing with these is tried again on the broker's next heartbeat.
RETRIED_RESUME_ERRORS = (ErrorCode.NOT_CONTROLLER, ErrorCode.REQUEST_TIMED_OUT)


def now_ms() -> int:
    return int(time.time() * 1000)


class BrokerLifecycle:
    """Registrations, heartbeats, sessions and session-expiry fencing on the active controller."""

    def __init__(self, server: ControllerServer, session_timeout_ms: int) -> None:
        self.server = server
        self.heartbeats = BrokerHeartbeatManager(session_timeout_ms)
        # broker id → (metadata offset, last contact ms, last time it was caught up ms or -1)
        self.observers: dict[int, tuple[int, int, int]] = {}
        # brokers whose heartbeats report an image that differs from the controllers'
        self.images = BrokerImageTracker()
        # Unfenced brokers with leaderless partitions they can lead left: an UnfenceBroker cut
        # off between its steps (its first step unfences, so no heartbeat asks for it again).
        # Their next heartbeat resumes it (``continue``).
        self.unfinished_unfence: set[int] = set()
        self._scan_image: MetadataImage | None = None  # to search for those, once active
        # A new process of a broker whose disks prove the registration (previous_broker_epoch),
        # refused while the old session lives: broker id → when it last asked (monotonic s).
        # Its expired session is not fenced while it keeps asking (RETURNING_GRACE_S): it will
        # replace the registration and keep its partitions instead (cluster_control).
        self.returning: dict[int, float] = {}
        # brokers whose expired sessions were left unfenced for that: broker id → old epoch
        self.deferred_fences: dict[int, int] = {}
        # Brokers whose controlled shutdown (BeginControlledShutdown, in steps) is being written
        # in the background: their heartbeats are answered at once meanwhile (:meth:`run`).
        self.shutting_down: set[int] = set()
        self._background: trio.Nursery | None = None

    def reset(self) -> None:
        """This controller became active: every registered broker gets a fresh session, and
        the image is searched (by the session timer, in slices) for unfences the previous
        active controller did not finish."""
        image = self.server.state_machine.image
        self.heartbeats.reset_all(now_ms(), image)
        self.images.forget_all()
        self.unfinished_unfence.clear()
        self.returning.clear()
        self.deferred_fences.clear()
        self._scan_image = image

    # ---- registration -----------------------------------------------------------------------

    async def register(
        self, req: BrokerRegistrationRequest, wire: dict[str, Any], ctx: Any
    ) -> dict[str, Any]:
        """BrokerRegistration: refused while another incarnation of the broker still has a live
        session (liveness is known only here), else written; the new epoch starts a session."""
        server = self.server
        spec = server.speculative
        existing = spec.image.brokers.get(req.broker_id) if spec is not None else None
        if (
            existing is not None
            and existing.incarnation_id != req.incarnation_id
            and self.heartbeats.has_live_session(req.broker_id, now_ms())
        ):
            if not existing.fenced and returning_disks(existing, wire):
                self.returning[req.broker_id] = time.monotonic()
            message = (
                f"Another broker {req.broker_id} (incarnation {existing.incarnation_id}) is "
                "registered and alive; retry once its session has expired."
            )
            code = ErrorCode.DUPLICATE_BROKER_REGISTRATION
            raise KraftError(
                code,
                message,
                {"error_code": int(code), "error_message": message, "broker_epoch": -1},
            )
        result = await server.submit(
            "BrokerRegistration",
            wire,
            request_id=getattr(ctx, "request_id", None),
            principal=getattr(ctx, "principal", "ANONYMOUS") or "ANONYMOUS",
            client_id=getattr(ctx, "client_id", "") or "",
        )
        self.heartbeats.register(req.broker_id, result["broker_epoch"], now_ms())
        self.returning.pop(req.broker_id, None)
        self.deferred_fences.pop(req.broker_id, None)
        self.images.forget(req.broker_id)
        log.info(
            "node %d: broker %d registered with epoch %d",
            server.node_id,
            req.broker_id,
            result["broker_epoch"],
        )
        return result

    # ---- heartbeats -------------------------------------------------------------------------

    async def heartbeat(
        self, req: BrokerHeartbeatRequest, wire: dict[str, Any], ctx: Any
    ) -> BrokerHeartbeatResponse:
        """BrokerHeartbeat: refresh the session, record the broker's progress, and write the
        transition (unfence, fence, controlled shutdown) the heartbeat manager decides on."""
        server = self.server
        if not server.is_active:
            raise server.not_controller()
        broker_id = req.broker_id
        now = now_ms()
        caught_up = req.metadata_offset >= server.log.next_offset - 1
        previous = self.observers.get(broker_id)
        self.observers[broker_id] = (
            req.metadata_offset,
            now,
            now if caught_up else previous[2] if previous else -1,
        )
        self._note_image(req)
        if broker_id in self.shutting_down and req.want_shutdown and not req.want_fence:
            answer = self._while_shutting_down(req, now)
            if answer is not None:
                return answer
        decision = self._decide(req, now)
        if decision.command is not None:
            api, cmd_body = decision.command
            if api == "BeginControlledShutdown" and self._background is not None:
                self.shutting_down.add(broker_id)
                self._background.start_soon(self._shut_down_in_background, broker_id, cmd_body)
                return BrokerHeartbeatResponse(
                    is_caught_up=decision.is_caught_up,
                    is_fenced=decision.is_fenced,
                    should_shut_down=False,
                )
            if api == "LogDirsOffline":
                log.warning(
                    "node %d: broker %d reports log dir(s) %s offline; moving %d of its "
                    "replicas there out of ISRs and leadership",
                    server.node_id,
                    broker_id,
                    ", ".join(req.offline_log_dir_paths or req.offline_log_dirs),
                    len(cmd_body["offline_replicas"]),
                )
            if api == "BeginControlledShutdown":
                error = await self._write_controlled_shutdown(broker_id, cmd_body)
            else:
                error = await self._write(broker_id, api, cmd_body)
            if error is not None:
                if api == "UnfenceBroker":
                    self.unfinished_unfence.add(broker_id)
            else:
                if api == "UnfenceBroker":
                    self.unfinished_unfence.discard(broker_id)
                decision = self._decide(req, now)
                if decision.should_shut_down and decision.command is not None:
                    # the shutdown it asked for is complete: fenced before it is told to go
                    await self._write(broker_id, *decision.command)
        elif broker_id in self.unfinished_unfence and not decision.is_fenced:
            reg = server.state_machine.image.brokers.get(broker_id)
            if reg is None or reg.in_controlled_shutdown:
                self.unfinished_unfence.discard(broker_id)  # leaving: nothing to lead
            else:
                await self._resume_unfence(broker_id, req.broker_epoch)
        return BrokerHeartbeatResponse(
            is_caught_up=decision.is_caught_up,
            is_fenced=decision.is_fenced,
            should_shut_down=decision.should_shut_down,
        )

    def _while_shutting_down(
        self, req: BrokerHeartbeatRequest, now: int
    ) -> BrokerHeartbeatResponse | None:
        """The answer to a heartbeat of a broker whose controlled shutdown is being written:
        "not yet" (None: not its current registration, answered by the full path's error)."""
        decision = self.heartbeats.hold(
            req.broker_id,
            req.broker_epoch,
            req.metadata_offset,
            now,
            self.server.state_machine.image,
        )
        if decision is None:
            return None
        return BrokerHeartbeatResponse(
            is_caught_up=decision.is_caught_up,
            is_fenced=decision.is_fenced,
            should_shut_down=False,
        )

    async def _write(self, broker_id: int, api: str, body: dict[str, Any]) -> KraftError | None:
        """Write a command a broker's heartbeat asked for (its session kept alive meanwhile);
        a failure is logged and returned."""
        try:
            await self.submit_keeping_session(broker_id, api, body)
        except KraftError as e:
            log.warning(
                "node %d: %s for broker %d failed: %s", self.server.node_id, api, broker_id, e
            )
            return e
        return None

    async def _write_controlled_shutdown(
        self, broker_id: int, body: dict[str, Any]
    ) -> KraftError | None:
        """Write a broker's BeginControlledShutdown, all its steps, then note where it ended
        (its later heartbeats wait for every active broker to reach it)."""
        error = await self._write(broker_id, "BeginControlledShutdown", body)
        if error is None:
            self.heartbeats.note_controlled_shutdown_offset(
                broker_id, self.server.state_machine.image.offset
            )
        return error

    async def _shut_down_in_background(self, broker_id: int, body: dict[str, Any]) -> None:
        """:meth:`_write_controlled_shutdown` while the broker's heartbeats are answered: at 2M
        partitions the steps outlast a heartbeat's RPC timeout, and a broker that gave up on its
        heartbeat went to the other controllers, was refused, and stopped heartbeating until its
        session expired and it was fenced the slow way."""
        try:
            await self._write_controlled_shutdown(broker_id, body)
        finally:
            self.shutting_down.discard(broker_id)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The session timer, and the nursery in which controlled shutdowns are written while
        their brokers' heartbeats are answered (without it, as in unit tests, a heartbeat
        writes its broker's controlled shutdown before it answers)."""
        async with trio.open_nursery() as nursery:
            self._background = nursery
            try:
                task_status.started()
                await self.session_timer_loop()
            finally:
                self._background = None

    async def _resume_unfence(self, broker_id: int, broker_epoch: int) -> None:
        """Finish an unfence cut off between its steps: leaderless partitions the broker can
        lead get it (kept for its next heartbeat if this fails too)."""
        log.info(
            "node %d: resuming broker %d's unfence: leaderless partitions it can lead",
            self.server.node_id,
            broker_id,
        )
        body = {"broker_id": broker_id, "broker_epoch": broker_epoch, "continue": True}
        error = await self._write(broker_id, "UnfenceBroker", body)
        if error is None or error.code not in RETRIED_RESUME_ERRORS:
            self.unfinished_unfence.discard(broker_id)

    async def _scan_for_unfinished_unfences(self, image: MetadataImage) -> None:
        """Add to :attr:`unfinished_unfence` the active brokers in the ISR of a leaderless
        partition of ``image``, a slice of topics at a time: a pass over a big image must not
        hold up the first writes of a new active controller."""
        active = frozenset(
            b for b, r in image.brokers.items() if not r.fenced and not r.in_controlled_shutdown
        )
        topics = list(image.topics_by_id.values())
        found: set[int] = set()
        for start in range(0, len(topics), SCAN_SLICE_TOPICS):
            found |= leaderless_isr_brokers(topics[start : start + SCAN_SLICE_TOPICS], active)
            await trio.sleep(0)
        if found and self.server.is_active:
            log.info(
                "node %d: brokers %s are unfenced with leaderless partitions they can lead; "
                "their next heartbeats finish those elections",
                self.server.node_id,
                sorted(found),
            )
            self.unfinished_unfence |= found

    def _note_image(self, req: BrokerHeartbeatRequest) -> None:
        """Track the image divergence a heartbeat reports; log each change once."""
        m = req.image_mismatch
        mismatch = (
            None
            if m is None
            else Mismatch(m.offset, m.checksum, m.controller_checksum, m.controller_id, m.fenced)
        )
        event = self.images.note(req.broker_id, mismatch)
        node_id = self.server.node_id
        if event is TrackerEvent.CLEARED:
            log.info(
                "node %d: broker %d's metadata image agrees with the controllers' again",
                node_id,
                req.broker_id,
            )
        elif event is not None and mismatch is not None:
            log.error(
                "node %d: broker %d's metadata image differs from the controllers' at offset "
                "%d: checksum %s, controller %d's %s; %s",
                node_id,
                req.broker_id,
                mismatch.offset,
                mismatch.checksum,
                mismatch.controller_id,
                mismatch.controller_checksum,
                "it still differs after reloading its image: it asks to be fenced"
                if event is TrackerEvent.FENCED
                else "it reloads its image from the controllers",
            )

    def _decide(self, req: BrokerHeartbeatRequest, now: int) -> HeartbeatDecision:
        return self.heartbeats.heartbeat(
            req.broker_id,
            req.broker_epoch,
            req.metadata_offset,
            req.want_fence,
            req.want_shutdown,
            now,
            self.server.state_machine.image,
            offline_log_dirs=tuple(req.offline_log_dir_paths or req.offline_log_dirs),
            offline_replicas=tuple((r.topic_id, r.partition) for r in req.offline_replicas),
        )

    async def submit_keeping_session(self, broker_id: int, api: str, body: dict[str, Any]) -> None:
        """Submit a command a broker's heartbeat asked for, refreshing that broker's session
        meanwhile: it is alive while its transition is written, which for a stepped one over
        tens of thousands of partitions can outlast the session timeout."""

        async def keep() -> None:
            while True:
                self.heartbeats.touch(broker_id, now_ms())
                await trio.sleep(KEEP_ALIVE_INTERVAL_S)

        error: KraftError | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep)
            try:
                await self.server.submit(api, body)
            except KraftError as e:
                error = e
            nursery.cancel_scope.cancel()
        if error is not None:
            raise error

    # ---- session expiry ---------------------------------------------------------------------

    def _defer_returning(
        self, expired: list[BrokerRegistration], now: float
    ) -> list[BrokerRegistration]:
        """``expired`` without the brokers whose next process is asking to replace their
        registration with its disks' proof (it registers at its next try and keeps its
        partitions: at 2M partitions a whole-cluster restart then moves nothing), plus the
        brokers deferred so earlier that stopped asking (fenced after all)."""
        image = self.server.state_machine.image
        fence = []
        for reg in expired:
            asked = self.returning.get(reg.broker_id)
            if asked is not None and now - asked < RETURNING_GRACE_S:
                self.deferred_fences[reg.broker_id] = reg.epoch
            else:
                fence.append(reg)
        for broker_id, epoch in list(self.deferred_fences.items()):
            current = image.brokers.get(broker_id)
            if current is None or current.epoch != epoch or current.fenced:
                del self.deferred_fences[broker_id]  # registered again, or gone
            elif now - self.returning.get(broker_id, 0.0) >= RETURNING_GRACE_S:
                del self.deferred_fences[broker_id]
                self.returning.pop(broker_id, None)
                if all(r.broker_id != broker_id for r in fence):
                    fence.append(current)
        return fence

    async def session_timer_loop(self) -> None:
        """Fence the brokers whose sessions have expired, all those found at one tick in one
        (stepped) FenceBroker (``also``): when many leave at once (a whole-cluster restart, a
        rack lost) each partition changes once, not once per replica, and none waits for the
        others' fences before its own."""
        server = self.server
        while True:
            await trio.sleep(SESSION_TIMER_INTERVAL_S)
            if not server.is_active:
                continue
            if self._scan_image is not None:
                image, self._scan_image = self._scan_image, None
                await self._scan_for_unfinished_unfences(image)
            now = now_ms()
            expired = []  # every broker whose session has expired by now, fenced together
            while (broker_id := self.heartbeats.next_expired(now)) is not None:
                reg = server.state_machine.image.brokers.get(broker_id)
                if reg is None:
                    self.heartbeats.forget(broker_id)
                    continue
                expired.append(reg)
            expired = self._defer_returning(expired, time.monotonic())
            if not expired:
                continue
            first, *others = expired
            ids = ", ".join(str(r.broker_id) for r in expired)
            log.info(
                "node %d: broker%s %s session expired; fencing %s",
                server.node_id,
                "s" if others else "",
                ids,
                "them" if others else "it",
            )
            body: dict[str, Any] = {
                "broker_id": first.broker_id,
                "broker_epoch": first.epoch,
                "reason": "session-timeout",
            }
            if others:
                body["also"] = [{"broker_id": r.broker_id, "broker_epoch": r.epoch} for r in others]
            try:
                await server.submit("FenceBroker", body)
            except KraftError as e:
                log.warning("node %d: fencing broker(s) %s failed: %s", server.node_id, ids, e)
