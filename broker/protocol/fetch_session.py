"""Incremental fetch sessions (KIP-227): the leader's cache of what each fetcher last asked for.

A client opens a session with a **full** fetch at epoch 0 (all its partitions); the leader
answers with a session id. Each later fetch is **incremental** (that id, the next epoch): it
carries only the partitions whose fetch position changed and the ones to forget, and the answer
carries only the partitions with records, an error, or a changed high watermark, last stable
offset or log start offset. Epoch -1 is a sessionless full fetch (and closes the named session).
An unknown session id is ``FETCH_SESSION_ID_NOT_FOUND`` (70), a wrong epoch
``INVALID_FETCH_SESSION_EPOCH`` (71): the client then starts over with a full fetch.

The cache holds at most ``max.incremental.fetch.session.cache.slots`` sessions. When full, a new
session takes the slot of the least recently used one idle for ``SESSION_EVICTION_MS``, else of
the least valuable one (consumer before follower, then fewer partitions, then least recently
used) if the newcomer is worth more (a follower, or more partitions); else the full fetch is answered without a session (id 0).

Pure logic: no I/O, the clock is given (``now_ms``), session ids come from the given ``random``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from broker.protocol.data_codec import FetchPartition, FetchPartitionResult, FetchRequest

INITIAL_EPOCH, FINAL_EPOCH = 0, -1
DEFAULT_CACHE_SLOTS = 1000  # Kafka's max.incremental.fetch.session.cache.slots
SESSION_EVICTION_MS = 120_000  # Kafka's: an idle session this old is always evictable

Key = tuple[str, int]
Results = list[tuple[str, list[FetchPartitionResult]]]


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch`` (wraps to 1, never back to the initial 0)."""
    return 1 if epoch >= 0x7FFFFFFF else epoch + 1


@dataclass(slots=True)
class CachedPartition:
    """A session partition: the client's last request for it and what it was last told."""

    request: FetchPartition
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1

    def must_answer(self, res: FetchPartitionResult) -> bool:
        """Record ``res``; True if an incremental response has to carry it."""
        changed = (
            self.high_watermark != res.high_watermark
            or self.last_stable_offset != res.last_stable_offset
            or self.log_start_offset != res.log_start_offset
        )
        self.high_watermark = res.high_watermark
        self.last_stable_offset = res.last_stable_offset
        self.log_start_offset = res.log_start_offset
        return changed or bool(res.records) or res.error_code != 0


@dataclass(slots=True)
class FetchSession:
    id: int
    privileged: bool  # a follower's session (worth more than a consumer's)
    epoch: int  # the epoch the next incremental fetch must carry
    partitions: dict[Key, CachedPartition]
    last_used_ms: float

    def value(self) -> tuple[bool, int, float]:
        """Eviction order: the smallest value goes first."""
        return self.privileged, len(self.partitions), self.last_used_ms


@dataclass(slots=True)
class FetchContext:
    """What one Fetch request reads (``topics``) and how its response is shaped (``respond``).
    ``error`` set: the request is answered with that top-level error and nothing else."""

    cache: FetchSessionCache
    kind: str  # "sessionless", "full" or "incremental"
    topics: list[tuple[str, list[FetchPartition]]]
    privileged: bool = False
    session: FetchSession | None = None
    epoch: int = 0  # the session epoch this (incremental) fetch used
    error: int = 0

    def respond(self, results: Results, now_ms: float) -> tuple[int, int, Results]:
        """(top-level error, session id, the results the response carries)."""
        if self.error:
            return self.error, 0, []
        if self.kind == "sessionless":
            return 0, 0, results
        if self.kind == "full":
            return 0, self.cache.create(self.privileged, self.topics, results, now_ms), results
        s = self.session
        assert s is not None  # an incremental context always has its session
        if s.epoch != next_epoch(self.epoch):  # another fetch used the session meanwhile
            return ErrorCode.invalid_fetch_session_epoch.value, 0, []
        out: Results = []
        for name, parts in results:
            keep = []
            for res in parts:
                key = (name, res.partition)
                cached = s.partitions.get(key)
                if cached is None or cached.must_answer(res):
                    keep.append(res)
                if cached is not None and res.records:  # to the back: no partition starves
                    del s.partitions[key]
                    s.partitions[key] = cached
            if keep:
                out.append((name, keep))
        return 0, s.id, out


@dataclass
class FetchSessionCache:
    """The leader's fetch sessions, bounded by ``max_slots``."""

    max_slots: int = DEFAULT_CACHE_SLOTS
    eviction_ms: float = SESSION_EVICTION_MS
    rng: random.Random = field(default_factory=random.Random)
    sessions: dict[int, FetchSession] = field(default_factory=dict)
    evictions: int = 0
    incremental_fetches: int = 0  # answered in a session (for the metrics)

    def partitions_cached(self) -> int:
        return sum(len(s.partitions) for s in self.sessions.values())

    def context(self, req: FetchRequest, now_ms: float) -> FetchContext:
        """Interpret a Fetch request's session fields; apply an incremental one to its session."""
        privileged = req.replica_id >= 0
        if req.session_epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if req.session_id:
                self.sessions.pop(req.session_id, None)
            kind = "full" if req.session_epoch == INITIAL_EPOCH else "sessionless"
            return FetchContext(self, kind, req.topics, privileged)
        s = self.sessions.get(req.session_id)
        if s is None:
            err = ErrorCode.fetch_session_id_not_found.value
            return FetchContext(self, "incremental", [], privileged, error=err)
        if s.epoch != req.session_epoch:
            err = ErrorCode.invalid_fetch_session_epoch.value
            return FetchContext(self, "incremental", [], privileged, error=err)
        for name, pids in req.forgotten:
            for pid in pids:
                s.partitions.pop((name, pid), None)
        for name, fparts in req.topics:
            for fp in fparts:
                cached = s.partitions.get((name, fp.partition))
                if cached is None:
                    s.partitions[(name, fp.partition)] = CachedPartition(fp)
                else:
                    cached.request = fp
        s.epoch = next_epoch(s.epoch)
        s.last_used_ms = now_ms
        self.incremental_fetches += 1
        topics: dict[str, list[FetchPartition]] = {}
        for (name, _), cached in s.partitions.items():
            topics.setdefault(name, []).append(cached.request)
        return FetchContext(
            self, "incremental", list(topics.items()), privileged, s, req.session_epoch
        )

    def create(
        self,
        privileged: bool,
        topics: list[tuple[str, list[FetchPartition]]],
        results: Results,
        now_ms: float,
    ) -> int:
        """A new session for a full fetch and its answer; its id, or 0 if no slot is free."""
        if self.max_slots <= 0 or not self._make_room(privileged, topics, now_ms):
            return 0
        answered = {(n, r.partition): r for n, parts in results for r in parts}
        partitions: dict[Key, CachedPartition] = {}
        for name, fparts in topics:
            for fp in fparts:
                cached = CachedPartition(fp)
                res = answered.get((name, fp.partition))
                if res is not None:
                    cached.must_answer(res)
                partitions[(name, fp.partition)] = cached
        sid = 0
        while sid == 0 or sid in self.sessions:
            sid = self.rng.randint(1, 0x7FFFFFFF)
        self.sessions[sid] = FetchSession(sid, privileged, 1, partitions, now_ms)
        return sid

    def _make_room(
        self, privileged: bool, topics: list[tuple[str, list[FetchPartition]]], now_ms: float
    ) -> bool:
        if len(self.sessions) < self.max_slots:
            return True
        oldest = min(self.sessions.values(), key=lambda s: s.last_used_ms)
        if now_ms - oldest.last_used_ms >= self.eviction_ms:
            victim = oldest
        else:
            victim = min(self.sessions.values(), key=FetchSession.value)
            size = sum(len(parts) for _, parts in topics)
            if victim.value()[:2] >= (privileged, size):  # not for an equal: no thrashing
                return False
        del self.sessions[victim.id]
        self.evictions += 1
        return True
