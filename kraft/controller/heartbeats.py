"""Broker liveness on the active controller (docs/kraft-notes.md: Heartbeats and liveness, Session expiry).

:class:`BrokerHeartbeatManager` is soft state, never written to the log: each broker's last
contact, last reported metadata offset and the offset at which its controlled shutdown was
written. It is pure: the caller passes ``now_ms`` and the current :class:`MetadataImage`, and
submits the command a :class:`HeartbeatDecision` asks for.

Heartbeat transitions (the registration in the image says whether the broker is fenced or in
controlled shutdown):

* FENCED + want-shutdown → SHUTDOWN_NOW (nothing to write: it is already fenced);
* FENCED + not want-fence + caught up → UNFENCED: ``UnfenceBroker`` (with the replicas on its
  offline log dirs, if any, which it must not lead);
* UNFENCED + want-fence → FENCED (SHUTDOWN_NOW with want-shutdown): ``FenceBroker``;
* UNFENCED + want-shutdown → CONTROLLED_SHUTDOWN when it leads a partition:
  ``BeginControlledShutdown``; when it leads nothing → SHUTDOWN_NOW: ``FenceBroker``;
* CONTROLLED_SHUTDOWN + want-fence → SHUTDOWN_NOW: ``FenceBroker``;
* CONTROLLED_SHUTDOWN while it still leads a partition: ``BeginControlledShutdown`` again (its
  steps may have been cut short by a failover; one with nothing left to move writes nothing);
* CONTROLLED_SHUTDOWN → SHUTDOWN_NOW once it leads nothing and the lowest metadata offset among
  active brokers has reached the offset where its shutdown records were written: ``FenceBroker``.
* UNFENCED with offline log dirs (KIP-858; the heartbeat lists the replicas on them) while one of
  those replicas still leads or shares an ISR: ``LogDirsOffline`` for those replicas. The list is
  remembered for the session (a new epoch, i.e. a restart, forgets it) and every heartbeat
  repeats it, so a new active controller relearns it and finishes what a failover cut short.

Session expiry: :meth:`BrokerHeartbeatManager.next_expired` names one broker (not known to be
fenced) whose session expired, oldest contact first, so each fence is visible before the next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kraft.controller.election import needs_offline_change
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.image import MetadataImage
from kraft.metadata.registrations import BrokerRegistration

__all__ = ["BrokerHeartbeatManager", "HeartbeatDecision"]

FENCED, UNFENCED, CONTROLLED_SHUTDOWN, SHUTDOWN_NOW = (
    "FENCED",
    "UNFENCED",
    "CONTROLLED_SHUTDOWN",
    "SHUTDOWN_NOW",
)


@dataclass(frozen=True, slots=True)
class HeartbeatDecision:
    """The answer to one heartbeat.

    ``is_caught_up``: the broker replayed up to its own registration; ``is_fenced``: fenced in
    the image the decision was made from; ``should_shut_down``: the broker may stop now (once
    ``command``, if any, is applied); ``command``: ``(api, body)`` for the caller to submit, or
    None. ``state``: the heartbeat state the broker moves to (FENCED, UNFENCED,
    CONTROLLED_SHUTDOWN, SHUTDOWN_NOW)."""

    is_caught_up: bool
    is_fenced: bool
    should_shut_down: bool
    command: tuple[str, dict[str, Any]] | None
    state: str = UNFENCED


class _Session:
    """What the manager knows about one broker."""

    __slots__ = (
        "ended",
        "epoch",
        "fenced",
        "last_contact_ms",
        "metadata_offset",
        "offline_log_dirs",
        "offline_replicas",
        "shutdown_offset",
    )

    def __init__(self, epoch: int, now_ms: int, fenced: bool | None) -> None:
        self.epoch = epoch
        self.last_contact_ms = now_ms
        self.metadata_offset = -1
        self.fenced = fenced  # None: not known yet (learned from the image on a heartbeat)
        self.shutdown_offset: int | None = None
        self.ended = False  # the broker was told to shut down: its session is over
        self.offline_log_dirs: tuple[str, ...] = ()  # as its last heartbeat reported them
        self.offline_replicas: tuple[tuple[str, int], ...] = ()


class BrokerHeartbeatManager:
    """Per-broker sessions and the heartbeat state machine; no clocks, no I/O."""

    def __init__(self, session_timeout_ms: int) -> None:
        if session_timeout_ms <= 0:
            raise ValueError("session_timeout_ms must be positive")
        self.session_timeout_ms = session_timeout_ms
        self._sessions: dict[int, _Session] = {}
        self._leads_cache: tuple[MetadataImage, dict[int, bool]] | None = None  # (image, answers)

    # ---- sessions ---------------------------------------------------------------------------

    def register(self, broker_id: int, epoch: int, now_ms: int, fenced: bool | None = None) -> None:
        """A broker registered (or is known from the image at activation): a fresh session.
        ``fenced`` is its registration's state when known; otherwise it is learned from the image
        at its next heartbeat (and until then it counts as possibly unfenced for expiry)."""
        session = self._sessions.get(broker_id)
        if session is None or session.epoch != epoch:
            self._sessions[broker_id] = _Session(epoch, now_ms, fenced)
            return
        session.last_contact_ms = now_ms
        if fenced is not None:
            session.fenced = fenced

    def touch(self, broker_id: int, now_ms: int) -> None:
        """Refresh last contact without any state change (e.g. a heartbeat that sat in a queue)."""
        session = self._sessions.get(broker_id)
        if session is not None:
            session.last_contact_ms = max(session.last_contact_ms, now_ms)

    def forget(self, broker_id: int) -> None:
        """Drop a broker (unregistered, or gone from the image)."""
        self._sessions.pop(broker_id, None)

    def reset_all(self, now_ms: int, image: MetadataImage | None = None) -> None:
        """Controller activation: every broker gets a fresh session and its fence state is learned
        again. With ``image``, the tracked brokers become exactly the image's registrations."""
        if image is not None:
            self._sessions = {
                b.broker_id: _Session(b.epoch, now_ms, b.fenced) for b in image.brokers.values()
            }
        else:
            for session in self._sessions.values():
                session.last_contact_ms = now_ms
                session.fenced = None
                session.shutdown_offset = None
        self._leads_cache = None

    def has_live_session(self, broker_id: int, now_ms: int) -> bool:
        """Whether the broker was heard from within the session timeout and has not been told to
        shut down (a cleanly stopped broker's next process may register at once)."""
        session = self._sessions.get(broker_id)
        return (
            session is not None
            and not session.ended
            and now_ms - session.last_contact_ms < self.session_timeout_ms
        )

    def next_expired(self, now_ms: int) -> int | None:
        """One broker not known to be fenced whose session expired (the oldest contact first), or
        None. The broker is then treated as fenced until a heartbeat shows otherwise, so it is
        named once; the caller fences it."""
        oldest_id, oldest = None, None
        for broker_id, session in self._sessions.items():
            if session.fenced:
                continue
            if oldest is None or (session.last_contact_ms, broker_id) < (
                oldest.last_contact_ms,
                oldest_id,
            ):
                oldest_id, oldest = broker_id, session
        if oldest is None or now_ms - oldest.last_contact_ms < self.session_timeout_ms:
            return None
        oldest.fenced = True
        return oldest_id

    def note_controlled_shutdown_offset(self, broker_id: int, offset: int) -> None:
        """The offset at which the broker's BeginControlledShutdown records were written."""
        session = self._sessions.get(broker_id)
        if session is not None:
            session.shutdown_offset = offset

    def offline(self, broker_id: int) -> tuple[tuple[str, ...], int]:
        """(the offline log dirs, the number of replicas on them) the broker's heartbeats report
        in its current session; ((), 0) when none or unknown."""
        session = self._sessions.get(broker_id)
        if session is None:
            return (), 0
        return session.offline_log_dirs, len(session.offline_replicas)

    def metadata_offset(self, broker_id: int) -> int:
        """The broker's last reported metadata offset (-1 if never heard)."""
        session = self._sessions.get(broker_id)
        return -1 if session is None else session.metadata_offset

    def lowest_active_offset(self, image: MetadataImage) -> int:
        """The lowest metadata offset reported by the brokers active in ``image`` (unfenced, not
        shutting down); -1 for one never heard from; a huge number when there is none."""
        lowest = None
        for reg in image.brokers.values():
            if reg.fenced or reg.in_controlled_shutdown:
                continue
            offset = self.metadata_offset(reg.broker_id)
            if lowest is None or offset < lowest:
                lowest = offset
        return (1 << 62) if lowest is None else lowest

    # ---- heartbeats -------------------------------------------------------------------------

    def hold(
        self, broker_id: int, epoch: int, metadata_offset: int, now_ms: int, image: MetadataImage
    ) -> HeartbeatDecision | None:
        """A heartbeat of a broker whose controlled shutdown is being written elsewhere: its
        session refreshed and its offset noted, "not yet" answered, nothing decided. None when
        ``epoch`` is not its current registration (:meth:`heartbeat` answers that with its
        error)."""
        reg = image.brokers.get(broker_id)
        session = self._sessions.get(broker_id)
        if reg is None or reg.epoch != epoch or session is None or session.epoch != epoch:
            return None
        session.last_contact_ms = max(session.last_contact_ms, now_ms)
        session.metadata_offset = max(session.metadata_offset, metadata_offset)
        return HeartbeatDecision(
            _caught_up(metadata_offset, reg), reg.fenced, False, None, CONTROLLED_SHUTDOWN
        )

    def heartbeat(
        self,
        broker_id: int,
        epoch: int,
        metadata_offset: int,
        want_fence: bool,
        want_shutdown: bool,
        now_ms: int,
        image: MetadataImage,
        *,
        offline_log_dirs: tuple[str, ...] = (),
        offline_replicas: tuple[tuple[str, int], ...] = (),
    ) -> HeartbeatDecision:
        """Process one heartbeat against ``image``. Raises BROKER_ID_NOT_REGISTERED for a broker
        the image does not know and STALE_BROKER_EPOCH for a wrong epoch. ``offline_log_dirs``
        (for display) and ``offline_replicas`` ((topic id, partition) pairs): the broker's
        offline log dirs and the replicas on them."""
        reg = image.brokers.get(broker_id)
        if reg is None:
            self._sessions.pop(broker_id, None)
            raise KraftError(
                ErrorCode.BROKER_ID_NOT_REGISTERED, f"Broker {broker_id} is not registered."
            )
        if epoch != reg.epoch:
            raise KraftError(
                ErrorCode.STALE_BROKER_EPOCH,
                f"Broker {broker_id} sent epoch {epoch}, but its registration has "
                f"epoch {reg.epoch}.",
            )
        session = self._sessions.get(broker_id)
        if session is None or session.epoch != reg.epoch:
            session = self._sessions[broker_id] = _Session(reg.epoch, now_ms, reg.fenced)
        session.last_contact_ms = max(session.last_contact_ms, now_ms)
        session.metadata_offset = max(session.metadata_offset, metadata_offset)
        session.fenced = reg.fenced
        session.offline_log_dirs = offline_log_dirs
        session.offline_replicas = offline_replicas
        caught_up = _caught_up(metadata_offset, reg)
        ident = {"broker_id": broker_id, "broker_epoch": reg.epoch}

        def decide(
            state: str, command: tuple[str, dict[str, Any]] | None = None
        ) -> HeartbeatDecision:
            session.ended = state == SHUTDOWN_NOW
            return HeartbeatDecision(caught_up, reg.fenced, state == SHUTDOWN_NOW, command, state)

        fence = ("FenceBroker", {**ident, "reason": "requested"})
        if reg.fenced:
            if want_shutdown:
                return decide(SHUTDOWN_NOW)
            if not want_fence and caught_up:
                unfence: dict[str, Any] = dict(ident)
                if offline_replicas:  # it must not lead these again (KIP-858)
                    unfence["offline_replicas"] = [
                        {"topic_id": t, "partition": p} for t, p in offline_replicas
                    ]
                return decide(UNFENCED, ("UnfenceBroker", unfence))
            return decide(FENCED)
        if not reg.in_controlled_shutdown:
            session.shutdown_offset = None
            if want_fence:
                return decide(SHUTDOWN_NOW if want_shutdown else FENCED, fence)
            if want_shutdown:
                if self.leads_any_partition(image, broker_id):
                    return decide(CONTROLLED_SHUTDOWN, ("BeginControlledShutdown", dict(ident)))
                return decide(
                    SHUTDOWN_NOW, ("FenceBroker", {**ident, "reason": "controlled-shutdown"})
                )
            moving = self.offline_to_move(image, broker_id, offline_replicas)
            if moving:
                offline = [{"topic_id": t, "partition": p} for t, p in moving]
                return decide(UNFENCED, ("LogDirsOffline", {**ident, "offline_replicas": offline}))
            return decide(UNFENCED)
        # in controlled shutdown
        if want_fence:
            return decide(SHUTDOWN_NOW, fence)
        if session.shutdown_offset is None:  # e.g. after a failover: wait for what is there now
            session.shutdown_offset = image.offset
        if self.leads_any_partition(image, broker_id):
            # BeginControlledShutdown moves leaders in steps; a failover can interrupt them, and
            # the new active controller continues them (a step with nothing to move writes nothing)
            return decide(CONTROLLED_SHUTDOWN, ("BeginControlledShutdown", dict(ident)))
        if self.lowest_active_offset(image) >= session.shutdown_offset:
            return decide(SHUTDOWN_NOW, ("FenceBroker", {**ident, "reason": "controlled-shutdown"}))
        return decide(CONTROLLED_SHUTDOWN)

    @staticmethod
    def offline_to_move(
        image: MetadataImage, broker_id: int, replicas: tuple[tuple[str, int], ...]
    ) -> list[tuple[str, int]]:
        """The offline replicas of ``broker_id`` that still lead or share an ISR in ``image``."""
        out: list[tuple[str, int]] = []
        for topic_id, pid in replicas:
            topic = image.topics_by_id.get(topic_id)
            partition = topic.partitions.get(pid) if topic is not None else None
            if partition is not None and needs_offline_change(partition, broker_id):
                out.append((topic_id, pid))
        return out

    def leads_any_partition(self, image: MetadataImage, broker_id: int) -> bool:
        """Whether ``broker_id`` leads a partition in ``image`` (cached per image)."""
        cache = self._leads_cache
        if cache is None or cache[0] is not image:
            cache = self._leads_cache = (image, {})
        answers = cache[1]
        if broker_id not in answers:
            answers[broker_id] = any(
                p.leader == broker_id
                for t in image.topics_by_id.values()
                for p in t.partitions.values()
            )
        return answers[broker_id]


def _caught_up(metadata_offset: int, reg: BrokerRegistration) -> bool:
    """Whether a broker has replayed its own registration (its epoch is that record's offset)."""
    return metadata_offset >= reg.epoch
