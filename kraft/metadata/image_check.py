"""Broker image checks: does a broker's metadata image agree with the controllers'?

Voters compare their logs' hash chains (``kraft.divergence``); a broker holds no log, only the
image it replayed, so it compares image checksums (``kraft.metadata.checksum``). At most every
``metadata.image.check.interval.ms`` a broker asks for the controller's checksum in a
FetchMetadata request; a controller states it only at the offset the broker will be at once it
has applied that answer. At that offset the broker compares with its own image's checksum.

:class:`ImageCheck` is the broker's side: when to ask, and what a comparison means. The first
disagreement asks for a reload (discard the image, fetch it again from the controllers); a
disagreement again after the reload means the broker cannot build the cluster's image and asks
to be fenced, so that it stops serving wrong metadata; an agreement clears either.
:class:`BrokerImageTracker` is the active controller's side: which brokers report a divergent
image, and when that changes (what to log once). Pure: no I/O, no clock of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = [
    "Action",
    "BrokerImageTracker",
    "ImageCheck",
    "Mismatch",
    "Stated",
    "TrackerEvent",
    "can_state",
    "reached_offset",
]


@dataclass(frozen=True)
class Stated:
    """A controller's image checksum at ``offset``, as its FetchMetadata answer stated it."""

    offset: int
    checksum: str
    node_id: int


@dataclass(frozen=True)
class Mismatch:
    """A broker's image differing from a controller's at ``offset``; ``fenced``: it differed
    again after a reload, so the broker asks to be fenced."""

    offset: int
    checksum: str  # the broker's
    controller_checksum: str
    controller_id: int
    fenced: bool


def reached_offset(from_offset: int, last_batch_end: int | None) -> int:
    """The offset a fetcher is at once it has applied an answer to ``FetchMetadata(from_offset)``:
    the end of its last batch, or ``from_offset - 1`` when it has none."""
    return from_offset - 1 if last_batch_end is None else last_batch_end


def can_state(image_offset: int, log_next_offset: int, reached: int) -> bool:
    """May a controller state its image checksum to a fetcher that reaches ``reached``? Only
    when its committed image is at its log end and that is exactly where the fetcher will be."""
    return reached >= 0 and image_offset == log_next_offset - 1 == reached


class Action(Enum):
    """What a comparison asks of the broker."""

    AGREE = "agree"  # nothing to do
    RECOVERED = "recovered"  # agrees again after a divergence: stop reporting, unfence
    RELOAD = "reload"  # first disagreement: discard the image, load it again
    FENCE = "fence"  # still disagrees after a reload: ask to be fenced
    STAY_FENCED = "stay-fenced"  # disagrees again while fenced: nothing new to do


class ImageCheck:
    """The broker's image check (module doc). ``interval_ms`` 0 disables it.

    Call :meth:`due` before each fetch (ask for the checksum when True), :meth:`stated` with
    what an answer stated, and, once that answer is applied, :meth:`take` with the image's
    offset: a stated checksum comes back only at exactly that offset, and :meth:`judge` then
    compares it with ours. A check that could not be made (no checksum stated, or at another
    offset) leaves the check due, so the next fetch asks again."""

    def __init__(self, interval_ms: int) -> None:
        self.interval_ms = interval_ms
        self.last_check_ms: int | None = None  # None: due at once
        self.expected: Stated | None = None
        self.mismatch: Mismatch | None = None  # the current divergence, reported in heartbeats
        self.checks = 0
        self.mismatches = 0

    @property
    def enabled(self) -> bool:
        return self.interval_ms > 0

    @property
    def fenced(self) -> bool:
        """True while the broker must ask to be fenced."""
        return self.mismatch is not None and self.mismatch.fenced

    def due(self, now_ms: int) -> bool:
        """Should the next fetch ask for the controller's checksum?"""
        if not self.enabled:
            return False
        last = self.last_check_ms
        return last is None or now_ms - last >= self.interval_ms

    def stated(self, stated: Stated | None) -> None:
        """An answer stated the controller's checksum (None: it did not)."""
        if stated is not None and self.enabled:
            self.expected = stated

    def take(self, image_offset: int) -> Stated | None:
        """The stated checksum to compare the image at ``image_offset`` with, or None. One
        stated at another offset is dropped (the image did not stop there)."""
        expected, self.expected = self.expected, None
        if expected is None or expected.offset != image_offset:
            return None
        return expected

    def judge(self, stated: Stated, ours: str, now_ms: int) -> Action:
        """Compare our image's checksum (at ``stated.offset``) with the controller's."""
        self.checks += 1
        self.last_check_ms = now_ms
        previous = self.mismatch
        if ours == stated.checksum:
            self.mismatch = None
            return Action.AGREE if previous is None else Action.RECOVERED
        self.mismatches += 1
        fenced = previous is not None  # a reload did not help (or we are fenced already)
        self.mismatch = Mismatch(stated.offset, ours, stated.checksum, stated.node_id, fenced)
        if not fenced:
            return Action.RELOAD
        return Action.STAY_FENCED if previous is not None and previous.fenced else Action.FENCE


class TrackerEvent(Enum):
    """A change :meth:`BrokerImageTracker.note` reports (each logged once)."""

    DIVERGED = "diverged"
    FENCED = "fenced"
    CLEARED = "cleared"


class BrokerImageTracker:
    """The brokers whose heartbeats report a divergent image (the active controller's view)."""

    def __init__(self) -> None:
        self.divergent: dict[int, Mismatch] = {}

    def note(self, broker_id: int, mismatch: Mismatch | None) -> TrackerEvent | None:
        """Record one heartbeat's report; the change it makes, or None."""
        previous = self.divergent.get(broker_id)
        if mismatch is None:
            if previous is None:
                return None
            del self.divergent[broker_id]
            return TrackerEvent.CLEARED
        self.divergent[broker_id] = mismatch
        if previous is None:
            return TrackerEvent.FENCED if mismatch.fenced else TrackerEvent.DIVERGED
        if mismatch.fenced and not previous.fenced:
            return TrackerEvent.FENCED
        return None

    def forget(self, broker_id: int) -> None:
        """A new incarnation registered: its image is a new one."""
        self.divergent.pop(broker_id, None)

    def forget_all(self) -> None:
        """Activation: every broker reports again with its next heartbeat."""
        self.divergent.clear()
