"""Keep CPython's cyclic garbage collector off a large metadata image.

A 1M-partition image is ~1M tracked objects (partition registrations); a full collection walks
all of them while holding the GIL (0.6-0.8 s on the bench machine), long enough to stall the
Raft ticks past an election timeout. Images are immutable and acyclic, so once built they
never need the cyclic collector: :class:`HeapFreezer` collects what is garbage now and moves the
survivors to the permanent generation (``gc.freeze``) after every ``every_records`` replayed
records (and when asked). Later collections then only walk what was allocated since. Frozen
objects are still freed by reference counting; only a cycle formed among objects that were alive
at a freeze is never reclaimed, which is why freezes follow image growth, not a timer.

:func:`gc_paused` holds the collector off for one burst of allocation (a broker transition's
step, proposed or applied): the dozens of young collections such a burst would trigger, each
walking the partition chunks copied so far, become one collection after it.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

DEFAULT_EVERY_RECORDS = 100_000


class HeapFreezer:
    """Counts replayed records and freezes the heap every ``every_records`` of them (thread-safe)."""

    def __init__(self, every_records: int = DEFAULT_EVERY_RECORDS) -> None:
        if every_records <= 0:
            raise ValueError("every_records must be positive")
        self.every_records = every_records
        self._since = 0
        self._lock = threading.Lock()

    def note(self, records: int) -> bool:
        """Count ``records`` newly replayed ones; freeze when enough accumulated. Returns
        whether it froze."""
        with self._lock:
            self._since += records
            if self._since < self.every_records:
                return False
            self._since = 0
        freeze_heap()
        return True


def freeze_heap() -> float:
    """Collect the unfrozen garbage, then freeze every surviving object; returns the seconds spent."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    spent = time.perf_counter() - started
    if log.isEnabledFor(logging.DEBUG):  # counting walks every frozen object
        log.debug("heap frozen (%d objects permanent) in %.3fs", gc.get_freeze_count(), spent)
    return spent


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off inside (if it was on): for synchronous code only, on one thread.
    What is allocated meanwhile is examined by the first collection after it, once."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
