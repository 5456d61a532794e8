"""The follower's side of an incremental fetch session (KIP-227) with one leader.

The first fetch is full (epoch 0: every partition; it also closes a previous session of ours).
When the leader answered it with a session id, each next fetch is incremental: it sends only the
partitions whose request changed (fetch offset, log start, leader epoch) or that are new, and
names the ones to forget. Any top-level error (``FETCH_SESSION_ID_NOT_FOUND``,
``INVALID_FETCH_SESSION_EPOCH``, ...), an unexpected session id, a lost connection or a new
partition set starts over with a full fetch. Pure logic: the fetcher does the I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.protocol.data_codec import FetchPartition
from broker.protocol.fetch_session import INITIAL_EPOCH, next_epoch

Key = tuple[str, int]


@dataclass(slots=True)
class SessionRequest:
    """The session fields and partitions of one Fetch request."""

    session_id: int
    epoch: int
    topics: list[tuple[str, list[FetchPartition]]]
    forgotten: list[tuple[str, list[int]]]

    @property
    def full(self) -> bool:
        return self.epoch == INITIAL_EPOCH


@dataclass
class FetchSessionBuilder:
    """Builds session fetches and follows the leader's answers."""

    session_id: int = 0
    epoch: int = INITIAL_EPOCH  # of the next request; 0: the next one is full
    sent: dict[Key, FetchPartition] = field(default_factory=dict)  # as the leader knows them
    _pending: dict[Key, FetchPartition] = field(default_factory=dict)
    _pending_full: bool = True
    full_fetches: int = 0
    incremental_fetches: int = 0

    def reset(self) -> None:
        """The next fetch is full (and closes the current session on the leader)."""
        self.epoch = INITIAL_EPOCH
        self.sent = {}

    def build(self, wanted: dict[Key, FetchPartition]) -> SessionRequest:
        """The request for fetching ``wanted`` (every partition to fetch, in order)."""
        self._pending = dict(wanted)
        self._pending_full = self.epoch == INITIAL_EPOCH or self.session_id == 0
        topics: dict[str, list[FetchPartition]] = {}
        forgotten: dict[str, list[int]] = {}
        if self._pending_full:
            self.full_fetches += 1
            for (name, _), fp in wanted.items():
                topics.setdefault(name, []).append(fp)
            return SessionRequest(self.session_id, INITIAL_EPOCH, list(topics.items()), [])
        self.incremental_fetches += 1
        for key, fp in wanted.items():
            if self.sent.get(key) != fp:
                topics.setdefault(key[0], []).append(fp)
        for name, pid in self.sent:
            if (name, pid) not in wanted:
                forgotten.setdefault(name, []).append(pid)
        return SessionRequest(
            self.session_id, self.epoch, list(topics.items()), list(forgotten.items())
        )

    def on_response(self, error: int, session_id: int) -> None:
        """Follow the leader's answer to the last built request."""
        if error:
            self.reset()
            return
        if self._pending_full:
            self.session_id = session_id
            self.epoch = next_epoch(INITIAL_EPOCH) if session_id else INITIAL_EPOCH
        elif session_id != self.session_id:
            self.reset()
            return
        else:
            self.epoch = next_epoch(self.epoch)
        self.sent = self._pending
