"""Leader-side ISR changes: shrink lagging followers, expand caught-up ones, via AlterPartition.

Every ``replica.lag.time.max.ms / 2`` the updater checks each partition this broker leads and
proposes dropping ISR followers that lagged longer than ``replica.lag.time.max.ms``; the fetch
path proposes adding a follower that caught up (:meth:`IsrUpdater.propose`). At most one change
per partition is in flight. Proposals are batched into one ``AlterPartition`` request to the
active controller carrying our broker epoch and the partition's leader and partition epochs,
plus a ``reason`` that ends up in the metadata log's provenance. An accepted change is adopted
at once (:meth:`Partition.adopt_isr`); a refused one (stale epochs, ineligible replica) is
dropped — the metadata log will bring the current state and the next check retries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import trio

from broker.replica.partition import Partition
from kraft.errors import KraftError

log = logging.getLogger("broker.isr")
REFUSED_BACKOFF_S = 1.0


class IsrUpdater:
    """Sends ISR changes for partitions led by ``replicas.broker_id``."""

    def __init__(
        self,
        client: Any,
        replicas: Any,
        broker_epoch: Callable[[], int],
        lag_time_max_ms: int,
        request_timeout: float = 10.0,
    ) -> None:
        self.client = client
        self.replicas = replicas
        self.broker_epoch = broker_epoch
        self.lag_time_max_ms = lag_time_max_ms
        self.request_timeout = request_timeout
        self._send, self._receive = trio.open_memory_channel[
            tuple[Partition, tuple[int, ...], str, int, int]
        ](float("inf"))

    def propose(self, part: Partition, isr: tuple[int, ...], reason: str) -> None:
        """Queue an ISR change for ``part`` unless one is already in flight."""
        if part.isr_change_pending or not part.is_leader or tuple(isr) == part.isr:
            return
        if time.monotonic() < part.isr_retry_at:
            return  # refused a moment ago (e.g. the replica is still fenced): not on every fetch
        part.isr_change_pending = True
        self._send.send_nowait((part, tuple(isr), reason, part.leader_epoch, part.partition_epoch))

    def check_shrink(self, now_ms: float | None = None) -> None:
        """Propose removing out-of-sync followers from every ISR this broker leads."""
        now_ms = time.monotonic() * 1000 if now_ms is None else now_ms
        for part in list(self.replicas.partitions.values()):
            if not part.is_leader or part.isr_change_pending:
                continue
            lagging = part.out_of_sync_replicas(now_ms, self.lag_time_max_ms)
            if lagging:
                self.propose(
                    part,
                    tuple(b for b in part.isr if b not in lagging),
                    f"isr-shrink: replica(s) {lagging} out of sync for more than "
                    f"{self.lag_time_max_ms} ms",
                )

    async def run(self) -> None:
        """Check for shrinks periodically and send proposals until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._send_loop)
            while True:
                await trio.sleep(max(0.05, self.lag_time_max_ms / 2000))
                self.check_shrink()

    async def _send_loop(self) -> None:
        async for first in self._receive:
            batch = [first]
            while True:
                try:
                    batch.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            by_reason: dict[str, list[tuple[Partition, tuple[int, ...], str, int, int]]] = {}
            for item in batch:  # one request per reason, so each batch's provenance says why
                by_reason.setdefault(item[2], []).append(item)
            for items in by_reason.values():
                await self._alter(items)

    async def _alter(self, batch: list[tuple[Partition, tuple[int, ...], str, int, int]]) -> None:
        topics: dict[str, list[dict[str, Any]]] = {}
        for part, isr, reason, leader_epoch, partition_epoch in batch:
            topics.setdefault(part.topic_id, []).append(
                {
                    "partition": part.partition,
                    "leader_epoch": leader_epoch,
                    "partition_epoch": partition_epoch,
                    "isr": list(isr),
                    "reason": reason,
                }
            )
            log.info(
                "%s-%d: proposing ISR %s -> %s (%s)",
                part.topic,
                part.partition,
                list(part.isr),
                list(isr),
                reason,
            )
        body = {
            "broker_id": self.replicas.broker_id,
            "broker_epoch": self.broker_epoch(),
            "topics": [{"topic_id": t, "partitions": ps} for t, ps in topics.items()],
        }
        answers: dict[tuple[str, int], dict[str, Any]] = {}
        try:
            resp = await self.client.call("AlterPartition", body, timeout=self.request_timeout)
            if resp.get("error_code", 0):
                log.warning("AlterPartition refused: %s", resp.get("error_message"))
            for t in resp.get("topics", []):
                for p in t.get("partitions", []):
                    answers[(t["topic_id"], p["partition"])] = p
        except KraftError as e:
            log.warning("AlterPartition failed: %s", e)
        for part, isr, _, leader_epoch, _ in batch:
            part.isr_change_pending = False
            ans = answers.get((part.topic_id, part.partition))
            if ans is None:
                continue
            if ans.get("error_code", 0):
                part.isr_retry_at = time.monotonic() + REFUSED_BACKOFF_S
                log.info(
                    "%s-%d: ISR change to %s refused: %s",
                    part.topic,
                    part.partition,
                    list(isr),
                    ans.get("error_message"),
                )
            elif ans["leader_epoch"] == part.leader_epoch == leader_epoch:
                part.adopt_isr(tuple(ans["isr"]), ans["partition_epoch"])
                log.info(
                    "%s-%d: ISR is now %s (partition epoch %d)",
                    part.topic,
                    part.partition,
                    list(part.isr),
                    part.partition_epoch,
                )
