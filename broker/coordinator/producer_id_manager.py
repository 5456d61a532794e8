"""Producer ids for InitProducerId, taken from blocks the controller allocates.

The controller hands out blocks (AllocateProducerIds → a ``ProducerIdsRecord`` in the metadata
log, 1,000 ids each) and never hands out an id twice, since the log remembers the next free id.
A broker uses its block from the bottom up; the ids left in it when the broker stops are never
used, so a restarted broker cannot reuse an id. The next block is requested when the current
one is exhausted, by one caller at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

log = logging.getLogger(__name__)
ALLOCATE_TIMEOUT_S = 10.0


class ProducerIdManager:
    """Hands out producer ids from this broker's current block."""

    def __init__(self, client: Any, broker_id: int, broker_epoch: Callable[[], int]) -> None:
        self.client = client  # kraft.rpc.client.ControllerClient
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self._next = 0
        self._end = 0
        self._lock = trio.Lock()

    async def next_id(self, timeout: float = ALLOCATE_TIMEOUT_S) -> int:
        """A producer id no one else has had; raises ``KraftError`` if no block can be had."""
        async with self._lock:
            if self._next >= self._end:
                resp = await self.client.call(
                    "AllocateProducerIds",
                    {"broker_id": self.broker_id, "broker_epoch": self.broker_epoch()},
                    timeout=timeout,
                )
                start, length = int(resp["producer_id_start"]), int(resp["producer_id_len"])
                self._next, self._end = start, start + length
                log.info(
                    "broker %d: producer id block [%d, %d) allocated",
                    self.broker_id,
                    start,
                    start + length,
                )
            pid = self._next
            self._next += 1
            return pid
