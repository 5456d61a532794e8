"""``RaftQuorum``: one PySyncObj member, seen from trio (its module-level patches of PySyncObj
live in ``pysyncobj_patches``, applied by :meth:`RaftQuorum.start`).

How a write flows
-----------------
``await submit(batch)`` (trio; the bytes of a record batch the active controller built) →
:class:`~kraft.quorum.group_commit.GroupCommitter` → one replicated call
``apply_group(batches, origin_term)`` → PySyncObj appends one Raft entry, syncs the journal
(``fsync="always"``), replicates → on commit *every* member runs ``apply_group``, which calls
``target.apply_entry(raft_index, term, batches)`` → on the submitting member the results go
back to the waiting ``submit``. The entries are opaque bytes here: nothing is re-executed.
A new leader proposes only once :meth:`RaftQuorum.leader_ready` (its first entry of the term,
PySyncObj's no-op, is applied). PySyncObj does not run a thread
of its own: its ticks run on the trio thread (:mod:`kraft.quorum.trio_ticker`), so a write never
crosses threads.

PySyncObj settings, chosen on purpose
-------------------------------------
* ``appendEntriesUseBatch=False``: with PySyncObj's batching on, a new entry waits for the next
  ``appendEntriesPeriod`` tick (0.1 s), i.e. ~10 sequential commits/s and ~100 ms latency.
  Off, the leader sends an entry the moment it is appended (its pipe notifier wakes the tick
  thread), so a commit costs one round trip. Batching is then ours: while one group is in
  flight, new commands queue and leave together as the next entry (``group_commit.py``).
  (Measurements: ``docs/performance.md``.)

  ``group_max_in_flight=1`` is the default: a second group in flight halves the group size
  and is no faster (one sync + one round trip per entry is the cost being amortised).
  ``group_fill_wait`` (``controller.group.commit.fill.ms``): see ``group_commit.py``.
* The leader syncs its journal once after each round of append_entries to all followers
  (``_SyncObj__sendAppendEntries``), not between two followers' sends, on the journal's syncer
  thread (the trio thread goes on serving requests); the acks wait for it.
* No extra round per commit: PySyncObj (batching off) follows every commit on the leader with
  an append_entries to each follower that only carries the new commit index, and an ack back —
  four messages per commit on top of the entry's own four. Here the commit index rides on the
  next entry, or goes out on a tick once ``commit_notice_delay`` (10 ms) has passed with nothing
  following (``auto_tick_period`` 10 ms: followers apply a commit at most ~20 ms after the
  leader when idle, at once under load). The message count per commit is what the commit
  path's CPU is made of.
* ``autoTick=False``: the ticks run on the trio thread (``trio_ticker.py``, measured there).
* Followers apply in batches (``follower_apply_batch`` 8 entries / ``follower_apply_delay``
  5 ms): applied one by one, each entry's apply ran on a follower right after its ack, on the
  two cores the leader needs at that moment to commit and answer. A follower lags by at most that
  (reads from it say the offset they reflect; a new leader applies the rest at once).
* Heartbeats during long applies: PySyncObj applies committed entries inside a tick and
  sends heartbeats only between ticks; the leader here also sends a round before applying and
  between applied entries whenever half a heartbeat period has passed (``_heartbeat_if_due``),
  so a tick applying a long backlog does not starve the followers into an election.
* ``commandsWaitLeader=False``: without a leader a call fails at once (we map it to
  ``NOT_CONTROLLER``) instead of being parked inside PySyncObj.
* We never forward commands: ``submit`` refuses on a non-leader, and every group carries the
  term it was submitted in; a group whose Raft entry has another term (PySyncObj forwarded it
  after we lost leadership, or it was re-proposed) is rejected deterministically on every
  member with ``NOT_CONTROLLER`` and never reaches the target.
* ``appendEntriesBatchSizeBytes`` is kept well above the largest group, so PySyncObj never
  uses its chunked "transmission" path for a single entry (that path's end-of-transfer check
  compares the pickled length with the raw length and can mark the wrong chunk as last).
* Election timeouts 0.4-1.0 s (PySyncObj: 0.4-1.4 s), for a quick failover.
* A late follower ack makes PySyncObj move the leader's nextIndex back and re-send an entry the
  follower may already have applied (it truncates and re-appends it); ``_on_peer_message``
  keeps nextIndex from going backwards on successful acks (see there).
* ``leaderFallbackTimeout`` short (default 2.5 s): a leader cut off from the majority steps
  down quickly instead of believing it leads for 30 s. ``connectionRetryTime`` 0.5 s so a
  restarted member is reconnected quickly.
* Compaction: ``serializer``/``deserializer`` hooks, ``useFork=False``, thresholds large by
  default (100,000 entries / 1 hour). The dump holds ``target.dump()`` and PySyncObj's
  bookkeeping (last two entries, cluster) in our own format (``_write_dump``), no pickle.
* ``password`` (required) → encrypted and authenticated Raft traffic: peers exchange pickles,
  and without it anyone reaching the Raft port, loopback included, could execute code. There is
  no unencrypted mode. Until a connection's first frame has decrypted, its frames may announce
  at most ``PRE_AUTH_MAX_FRAME_BYTES``; a frame left half-sent, or an incoming connection that
  has not identified itself, for ``STALL_TIMEOUT_S`` is closed (checked on every tick).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import msgpack
import pysyncobj.syncobj as _syncobj_module
import trio
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.journal import FileJournal  # noqa: F401 -- PySyncObj's v1 journal, for tests
from pysyncobj.monotonic import monotonic as _monotonic
from pysyncobj.node import TCPNode
from pysyncobj.syncobj import SyncObjException
from pysyncobj.transport import TCPTransport

import kraft.quorum.pysyncobj_patches as pysyncobj_patches
from kraft.errors import ErrorCode, KraftError
from kraft.quorum.durable_journal import DurableJournal, register_journal, unregister_journal
from kraft.quorum.group_commit import GroupCommitter
from kraft.quorum.prevote import PRE_VOTE_REQUEST, PRE_VOTE_RESPONSE
from kraft.quorum.prevote import counters as prevote_counters
from kraft.quorum.pysyncobj_patches import (  # noqa: F401 -- re-exported (tests, docs)
    COMPRESS_MIN_BYTES,
    EPOLL_POLLER,
    MAX_RAFT_FRAME_BYTES,
    PRE_AUTH_MAX_FRAME_BYTES,
    STALL_TIMEOUT_S,
)
from kraft.quorum.trio_ticker import EpollPoller, TickLoop
from kraft.storage.failure import storage_failed

logger = logging.getLogger(__name__)

_STATE_NAMES = {0: "follower", 1: "candidate", 2: "leader"}
_DUMP_MAGIC = b"KRAFTDMP"
_DUMP_HEADER = struct.Struct(">8sII")  # magic, format version, metadata length


class ApplyTarget(Protocol):
    """The controller's apply side. All methods are called inside a PySyncObj tick (trio thread)."""

    def apply_entry(self, raft_index: int, term: int, commands: list[bytes]) -> list[Any]:
        """Apply one committed entry's commands in order; one result per command."""

    def last_applied_raft_index(self) -> int:
        """Entries with a Raft index ≤ this are already reflected and are not applied again."""

    def dump(self) -> bytes:
        """A snapshot of the applied state (for PySyncObj's log compaction)."""

    def load(self, data: bytes) -> None:
        """Install a snapshot produced by ``dump`` (a lagging follower, or restart)."""

    # Optional: ``between_commands``, an attribute the quorum sets to a callable the target
    # calls between the commands of an entry (the leader's heartbeat check).


@dataclass(frozen=True)
class RaftSettings:
    """Tuning of one quorum member; see the module docstring for why these defaults."""

    password: str | None = None
    fsync: str = "always"  # "always" | "never"
    raft_min_timeout: float = 0.4
    raft_max_timeout: float = 1.0
    append_entries_period: float = 0.1
    connection_timeout: float = 2.0
    connection_retry_time: float = 0.5
    leader_fallback_timeout: float = 2.5
    compaction_min_entries: int = 100_000
    compaction_min_time: float = 3600.0
    group_max_commands: int = 1000
    group_max_bytes: int = 8 << 20  # a group of record batches (a 10,000-record one is ~2 MB)
    group_max_in_flight: int = 1
    group_fill_wait: float = 0.002
    auto_tick_period: float = 0.01
    commit_notice_delay: float = 0.01
    follower_apply_batch: int = 8
    follower_apply_delay: float = 0.005
    prevote: bool = True  # False only in tests of a quorum mixing members with and without

    def validate(self) -> None:
        if self.fsync not in ("always", "never"):
            raise ValueError(f"fsync must be 'always' or 'never', not {self.fsync!r}")
        if not 0 < self.raft_min_timeout < self.raft_max_timeout:
            raise ValueError("need 0 < raft_min_timeout < raft_max_timeout")
        if self.leader_fallback_timeout <= 0 or self.compaction_min_entries < 2:
            raise ValueError("leader_fallback_timeout must be > 0, compaction_min_entries >= 2")
        if self.follower_apply_batch < 1 or self.follower_apply_delay < 0:
            raise ValueError("follower_apply_batch must be >= 1, follower_apply_delay >= 0")


def _host_of(addr: str) -> str:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"Raft address {addr!r} is not host:port")
    return host.strip("[]")


# Vote traffic a wiped, not yet caught-up voter may not take part in (refuses_vote_message)
VOTE_MESSAGES = ("request_vote", "response_vote", PRE_VOTE_REQUEST, PRE_VOTE_RESPONSE)
# Sent without syncing the journal first: the leader's append_entries (synced after the round,
# see _sync_before_send) and pre-votes (they promise nothing)
NO_SYNC_MESSAGES = ("append_entries", PRE_VOTE_REQUEST, PRE_VOTE_RESPONSE)


class _SyncingTransport(TCPTransport):  # type: ignore[misc]  # pysyncobj ships no type hints
    """PySyncObj's TCP transport, syncing the journal before every outgoing message and
    letting the quorum look at incoming ones (``RaftQuorum._on_peer_message``)."""

    def __init__(
        self,
        syncObj: Any,
        selfNode: Any,
        otherNodes: Any,
        *,
        before_send: Callable[[Any], None],
        on_message: Callable[[Any, Any, Callable[[Any, Any], None]], None],
    ) -> None:
        self._before_send = before_send
        self._on_message = on_message
        self._last_stall_check = 0.0
        super().__init__(syncObj, selfNode, otherNodes)

    def send(self, node: Any, message: Any) -> bool:
        conn = self._connections.get(node)
        if conn is not None and self._syncObj.encryptor and not conn.sendRandKey:
            # PySyncObj's outgoing connection is CONNECTED before the session keys are
            # exchanged: a message sent now goes out without the peer's key, the peer takes it
            # for garbage ("too many values to unpack") and drops the connection, which under
            # load cost leaders their heartbeats. Not sent: the caller retries as after a
            # failed send.
            return False
        self._before_send(message)
        return cast(bool, super().send(node, message))

    def _onNewIncomingConnection(self, conn: Any) -> None:
        conn.kraft_accepted_at = _monotonic()
        super()._onNewIncomingConnection(conn)

    def _onTick(self) -> None:
        super()._onTick()
        now = _monotonic()
        if now - self._last_stall_check >= 0.5:
            self._last_stall_check = now
            self.close_stalled(now)

    def close_stalled(self, now: float) -> None:
        """Close a connection whose frame has been half-sent for ``STALL_TIMEOUT_S``, and an
        incoming one still unidentified after it (PySyncObj checks a connection's timeout only
        when it has an event, so a peer that stops mid-frame would hold it forever)."""
        unknown = list(self._unknownConnections)
        for conn in unknown + list(self._connections.values()):
            since = getattr(conn, "kraft_partial_since", None)
            accepted = getattr(conn, "kraft_accepted_at", None)
            stalled = since is not None and now - since > STALL_TIMEOUT_S
            if conn in unknown and accepted is not None and now - accepted > STALL_TIMEOUT_S:
                stalled = True
            if stalled:
                logger.warning("raft: closing a connection stalled for over %gs", STALL_TIMEOUT_S)
                conn.disconnect()
                self._unknownConnections.discard(conn)

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        self._on_message(node, message, super()._onMessageReceived)


class _Rejected:
    """``apply_group``'s answer for a group not applied (wrong term / apply failure)."""

    __slots__ = ("code", "message")

    def __init__(self, code: ErrorCode, message: str) -> None:
        self.code = code
        self.message = message


class _KraftSyncObj(SyncObj):  # type: ignore[misc]  # pysyncobj ships no type hints
    """The PySyncObj object: one replicated method, everything else delegated to the quorum."""

    _SyncObj__newAppendEntriesTime: float  # PySyncObj's, set in its __init__

    def __init__(
        self,
        quorum: RaftQuorum,
        self_addr: str,
        partners: list[str],
        conf: SyncObjConf,
        transport_class: Any,
    ) -> None:
        self._kraft = quorum
        self.kraft_prevote = quorum.settings.prevote  # read by kraft.quorum.prevote
        quorum._so = self  # before SyncObj.__init__ (it may call back into the quorum)
        super().__init__(self_addr, partners, conf=conf, transportClass=transport_class)

    @replicated  # type: ignore[untyped-decorator]  # pysyncobj ships no type hints
    def apply_group(self, commands: list[bytes], origin_term: int) -> Any:
        return self._kraft._apply_committed(self, commands, origin_term)

    def _SyncObj__applyLogEntries(self) -> bool:
        """PySyncObj's apply step, minus its extra round of append_entries after every commit.

        With batching off, PySyncObj answers each commit on the leader with an immediate
        append_entries to every follower (only to carry the new commit index) and gets an ack
        back from each: 4 messages per commit on top of the entry's own 4. The commit index
        rides on the next entry's append_entries anyway, so here it waits for that — or, when
        nothing follows, goes out on the first tick after ``commit_notice_delay``. Also sends a
        heartbeat round before a possibly long apply (``_heartbeat_if_due``).

        A follower applies in batches: while it is fewer than ``follower_apply_batch`` entries
        behind and its oldest unapplied commit is younger than ``follower_apply_delay``, it
        waits (a tick comes at least every ``auto_tick_period``)."""
        quorum = self._kraft
        behind = self._SyncObj__raftCommitIndex - self.raftLastApplied
        if behind > 0 and not self._isLeader():
            now = _monotonic()
            if quorum._unapplied_since is None:
                quorum._unapplied_since = now
            if (
                behind < quorum.settings.follower_apply_batch
                and now - quorum._unapplied_since < quorum.settings.follower_apply_delay
            ):
                return False
        quorum._unapplied_since = None
        if behind > 0:
            quorum._heartbeat_if_due(self)  # before a possibly long apply
        need_send: bool = SyncObj._SyncObj__applyLogEntries(self)
        if need_send and self._isLeader():
            self._SyncObj__newAppendEntriesTime = min(
                self._SyncObj__newAppendEntriesTime,
                _monotonic() + self._kraft.settings.commit_notice_delay,
            )
            return False
        return need_send

    def _SyncObj__sendAppendEntries(self) -> None:
        """PySyncObj's round of append_entries to every follower, then the leader's own journal
        sync, started on the journal's syncer thread (not after the first follower's send, which
        would hold the second follower's copy back by one disk sync, and not on this thread,
        which serves requests meanwhile); an ack is counted only once it is done."""
        quorum = self._kraft
        quorum._last_append_round = _monotonic()
        try:
            SyncObj._SyncObj__sendAppendEntries(self)
        finally:
            journal = quorum._journal
            if journal is not None:  # on the syncer thread: an ack waits for it (_on_peer_message)
                journal.start_sync()

    # -- PySyncObj internals, read only here (name-mangled private attributes) --
    def entry_term(self, raft_index: int) -> int | None:
        entries = self._SyncObj__getEntries(raft_index, 1)
        return entries[0][2] if entries else None

    def last_log_index(self) -> int:
        return cast(int, self._SyncObj__raftLog[-1][1])

    def first_index_of_term(self) -> int | None:
        """The index of the no-op PySyncObj appends on becoming leader (None before)."""
        return cast("int | None", self._SyncObj__noopIDx)

    def last_response_times(self) -> dict[Any, float]:
        return dict(self._SyncObj__lastResponseTime)

    def next_index(self) -> dict[Any, int]:
        return cast(dict[Any, int], self._SyncObj__raftNextIndex)


class RaftQuorum:
    """One controller's Raft membership (PySyncObj), driven from trio."""

    def __init__(
        self,
        node_id: int,
        self_addr: str,
        partners: dict[int, str],
        raft_dir: Path,
        target: ApplyTarget,
        settings: RaftSettings | None = None,
        joining: bool = False,
    ) -> None:
        settings = settings or RaftSettings()
        settings.validate()
        for addr in [self_addr, *partners.values()]:
            _host_of(addr)
        if not settings.password:
            raise ValueError(
                f"refusing to run Raft on {self_addr} without a password: PySyncObj peers "
                "exchange pickles, so anyone who can reach the port (loopback included) could "
                "execute code. Set controller.raft.secret.file or KRAFT_RAFT_SECRET."
            )
        if node_id in partners:
            raise ValueError(f"node {node_id} is listed among its own partners")
        self.node_id = node_id
        self.self_addr = self_addr
        self.partners = dict(partners)
        self.raft_dir = Path(raft_dir)
        self.target = target
        self.settings = settings
        self._addr_to_id = {addr: nid for nid, addr in partners.items()}
        self._addr_to_id[self_addr] = node_id
        self._so: _KraftSyncObj | None = None
        self._journal: DurableJournal | None = None
        self._ticks: TickLoop | None = None
        self._committer = GroupCommitter(
            self._send_group,
            max_commands=settings.group_max_commands,
            max_bytes=settings.group_max_bytes,
            max_in_flight=settings.group_max_in_flight,
            fill_wait=settings.group_fill_wait,
        )
        self._subscribers: list[trio.MemorySendChannel[tuple[bool, int]]] = []
        self._observed: tuple[bool, int] = (False, 0)
        self._last_append_round = 0.0  # when the leader last sent a round of append_entries
        self._unapplied_since: float | None = None  # a follower's oldest unapplied commit
        self._heartbeat_period = min(settings.append_entries_period, settings.raft_min_timeout / 4)
        self._closed = False
        # A member formatted to join a running quorum (an empty or rebuilt directory): it
        # does not campaign, grants votes only to candidates with history, and stays so until
        # it has applied the commit index of the first leader it heard from and the node has
        # checked that leader's cluster id (finish_join).
        self.joining = joining
        self._join_target: int | None = None
        self._join_refused_votes = 0
        # Voters whose directory id changed and who have not caught up yet (kraft/storage/
        # voter_directories.py, kept up to date by the node): their votes are not counted.
        self.unverified_voters: set[int] = set()
        self._unverified_dropped = 0
        self._counters = {
            "entries_applied": 0,
            "entries_skipped": 0,
            "entries_rejected": 0,
            "apply_errors": 0,
            "dumps_written": 0,
            "dumps_loaded": 0,
        }

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def journal_path(self) -> Path:
        return self.raft_dir / "journal.bin"

    @property
    def dump_path(self) -> Path:
        return self.raft_dir / "dump.bin"

    def start(self) -> None:
        """Bind the Raft port and start ticking PySyncObj on this trio thread (a trio system
        task, until :meth:`close`). Call from the trio thread."""
        if self._so is not None:
            raise RuntimeError("already started")
        pysyncobj_patches.apply()  # idempotent; the controller also applies them at start-up
        self.raft_dir.mkdir(parents=True, exist_ok=True)
        s = self.settings
        fsync = s.fsync == "always"
        journal_file = str(self.journal_path)

        def make_journal(path: str) -> DurableJournal:
            self._journal = DurableJournal(path, fsync=fsync)
            return self._journal

        conf = SyncObjConf(
            password=s.password,
            autoTick=False,
            autoTickPeriod=s.auto_tick_period,
            pollerType=EPOLL_POLLER,
            maxBindRetries=1,  # a Raft port in use is an error at start (not a retry every second)
            raftMinTimeout=s.raft_min_timeout,
            raftMaxTimeout=s.raft_max_timeout,
            appendEntriesPeriod=self._heartbeat_period,
            connectionTimeout=max(s.connection_timeout, s.raft_max_timeout),
            connectionRetryTime=s.connection_retry_time,
            leaderFallbackTimeout=s.leader_fallback_timeout,
            appendEntriesUseBatch=False,
            appendEntriesBatchSizeBytes=4 * s.group_max_bytes + (1 << 20),
            commandsWaitLeader=False,
            logCompactionMinEntries=s.compaction_min_entries,
            logCompactionMinTime=s.compaction_min_time,
            logCompactionBatchSize=1 << 18,
            journalFile=journal_file,
            fullDumpFile=str(self.dump_path),
            serializer=self._write_dump,
            deserializer=self._read_dump,
            useFork=False,
            dynamicMembershipChange=False,
            onStateChanged=lambda old, new: self._observe(),
            bindAddress=self.self_addr,
        )
        register_journal(_syncobj_module, journal_file, make_journal)
        transport = functools.partial(
            _SyncingTransport, before_send=self._sync_before_send, on_message=self._on_peer_message
        )
        try:
            so = _KraftSyncObj(self, self.self_addr, list(self.partners.values()), conf, transport)
        except BaseException as exc:
            self._so = None
            if self._journal is not None:
                self._journal._destroy()
                self._journal = None
            if isinstance(exc, SyncObjException) and exc.errorCode == "BindError":
                raise OSError(
                    errno.EADDRINUSE, f"raft address {self.self_addr} is in use"
                ) from None
            raise
        finally:
            unregister_journal(journal_file)
        if self.joining:
            self._hold_election(so)
            logger.warning(
                "raft member %d: joining a running quorum: no campaign, no vote for a candidate "
                "without history, until caught up from a leader",
                self.node_id,
            )
        poller = so._poller
        assert isinstance(poller, EpollPoller)
        self._ticks = TickLoop(functools.partial(so.doTick, 0.0), poller, s.auto_tick_period)
        so._SyncObj__pipeNotifier = self._ticks  # a submitted command nudges the loop to tick
        so.addOnTickCallback(self._observe)
        if hasattr(self.target, "between_commands"):  # heartbeats inside a long entry too
            self.target.between_commands = functools.partial(self._heartbeat_if_due, so)
        self._ticks.start()
        logger.info(
            "raft member %d on %s, partners %s, fsync=%s",
            self.node_id,
            self.self_addr,
            self.partners,
            s.fsync,
        )

    def close(self) -> None:
        """Stop PySyncObj (its sockets and journal are closed on return). Queued submissions
        fail with ``NOT_CONTROLLER``, those already replicating with ``REQUEST_TIMED_OUT`` (they
        may have committed)."""
        if self._closed:
            return
        self._closed = True
        so, self._so = self._so, None
        if self._ticks is not None:
            self._ticks.stop()
        if so is not None:
            so.destroy()  # autoTick=False: closes the transport and the journal right here
        self._committer.fail_all(KraftError(ErrorCode.NOT_CONTROLLER, "quorum closed"))
        self._committer.fail_in_flight(
            KraftError(
                ErrorCode.REQUEST_TIMED_OUT, "quorum closed; the command may still have committed"
            )
        )
        for channel in self._subscribers:
            channel.close()
        self._subscribers.clear()

    # ---- trio API ---------------------------------------------------------------------------
    async def submit(self, command: bytes, timeout: float) -> Any:
        """Replicate ``command`` and return ``target.apply_entry``'s result for it.

        Raises ``KraftError(NOT_CONTROLLER)`` when this member is not the leader (checked before
        submitting; the RPC layer redirects clients) or loses leadership before the group is
        appended, and ``KraftError(REQUEST_TIMED_OUT)`` after ``timeout`` seconds — in that case
        the command **may still commit** (make retries idempotent: request ids)."""
        return await self.wait(self.enqueue(command, timeout), timeout)

    def enqueue(self, command: bytes, timeout: float) -> Any:
        """Queue ``command`` for replication now, without yielding (commands are replicated in
        the order queued); :meth:`wait` gives its outcome. Raises as :meth:`submit` does."""
        if self._so is None or self._closed:
            raise KraftError(ErrorCode.NOT_CONTROLLER, "quorum is not running")
        if not self.is_leader:
            raise KraftError(ErrorCode.NOT_CONTROLLER, self._not_leader_message())
        return self._committer.enqueue(command, timeout)

    async def wait(self, queued: Any, timeout: float) -> Any:
        """The outcome of a command :meth:`enqueue` queued."""
        return await self._committer.wait(queued, timeout)

    @property
    def is_leader(self) -> bool:
        so = self._so
        return so is not None and so._isLeader()

    @property
    def leader_id(self) -> int | None:
        so = self._so
        leader = so._getLeader() if so is not None else None
        return None if leader is None else self._addr_to_id.get(leader.id)

    @property
    def term(self) -> int:
        so = self._so
        return so.raftCurrentTerm if so is not None else 0

    def leader_ready(self, term: int) -> bool:
        """This member leads in ``term`` and has applied every entry up to its own first entry
        of the term (PySyncObj's no-op): the committed state is final for everything proposed
        before, so proposals built on it chain onto what every member has."""
        so = self._so
        if so is None or not so._isLeader() or so.raftCurrentTerm != term:
            return False
        first = so.first_index_of_term()
        return first is not None and so.raftLastApplied >= first

    def leadership_events(self, buffer: int = 64) -> trio.MemoryReceiveChannel[tuple[bool, int]]:
        """A channel of ``(is_leader, term)``: the current state first, then every change."""
        send, recv = trio.open_memory_channel[tuple[bool, int]](buffer)
        send.send_nowait((self.is_leader, self.term))
        self._subscribers.append(send)
        return recv

    def status(self) -> dict[str, Any]:
        """Leader, term, commit/applied index, per-voter progress, quorum, state."""
        so = self._so
        if so is None:
            return {
                "node_id": self.node_id,
                "state": "stopped",
                "leader_id": None,
                "term": 0,
                "commit_index": 0,
                "last_applied": 0,
                "has_quorum": False,
                "voters": {},
            }
        st = so.getStatus()  # the trio thread is PySyncObj's only thread: a consistent read
        responses = so.last_response_times()
        last_index = so.last_log_index()
        is_leader = st["state"] == 2
        leader = st.get("leader")
        now = _monotonic()
        voters: dict[int, dict[str, Any]] = {
            self.node_id: {
                "address": self.self_addr,
                "match_index": last_index,
                "lag": 0,
                "connected": True,
                "last_contact_ms": 0,
            }
        }
        for nid, addr in sorted(self.partners.items()):
            match = st.get(f"match_idx_server_{addr}") if is_leader else None
            seen = responses.get(_node_key(addr)) if is_leader else None
            voters[nid] = {
                "address": addr,
                "match_index": match,
                "lag": (last_index - match) if match is not None else None,
                "connected": st.get(f"partner_node_status_server_{addr}") == 2,
                "last_contact_ms": int((now - seen) * 1000) if seen is not None else None,
            }
        return {
            "node_id": self.node_id,
            "state": _STATE_NAMES.get(st["state"], str(st["state"])),
            "leader_id": None if leader is None else self._addr_to_id.get(leader.id),
            "term": st["raft_term"],
            "commit_index": st["commit_idx"],
            "last_applied": st["last_applied"],
            "last_log_index": last_index,
            "log_len": st["log_len"],
            "has_quorum": st["has_quorum"],
            "voters": voters,
        }

    def stats(self) -> dict[str, int]:
        """Counters: group commit, journal syncs, applied/skipped/rejected entries, dumps,
        pre-votes."""
        c = self._committer
        j = self._journal
        so = self._so
        return {
            "groups_sent": c.groups_sent,
            "commands_sent": c.commands_sent,
            "largest_group": c.largest_group,
            "groups_failed": c.groups_failed,
            "group_fill_waits": c.fill_waits,
            "queued": c.queued,
            "in_flight": c.in_flight,
            "journal_syncs": j.journal_syncs if j else 0,
            "journal_background_syncs": j.background_syncs if j else 0,
            "journal_synced_index": j.synced_index if j else 0,
            "journal_meta_syncs": j.meta_syncs if j else 0,
            "raft_ticks": self._ticks.ticks if self._ticks else 0,
            **self._counters,
            **(prevote_counters(so) if so is not None else {}),
        }

    def force_compaction(self) -> None:
        """Ask PySyncObj to compact its log (write the dump) on its next tick."""
        if self._so is not None:
            self._so.forceLogCompaction()

    # ---- trio side of group commit --------------------------------------------------------
    def _send_group(self, commands: list[bytes], complete: Callable[..., None]) -> None:
        so = self._so
        if so is None or not so._isLeader():
            raise KraftError(ErrorCode.NOT_CONTROLLER, self._not_leader_message())
        ticks = self._ticks
        assert ticks is not None

        def on_result(result: Any, reason: int) -> None:  # inside a tick
            ticks.call_after_tick(self._finish_group, complete, result, reason)

        if ticks.in_tick:
            so.apply_group(commands, so.raftCurrentTerm, callback=on_result)  # nudges the loop
            return
        ticks.notify_muted = True
        try:
            so.apply_group(commands, so.raftCurrentTerm, callback=on_result)
        finally:
            ticks.notify_muted = False
        # append and replicate now (the part of PySyncObj's tick that does it) rather than on
        # the tick loop's next turn: the entry leaves one trio scheduling round earlier
        so._checkCommandsToApply()

    def _finish_group(self, complete: Callable[..., None], result: Any, reason: int) -> None:
        if reason == FAIL_REASON.SUCCESS and isinstance(result, list):
            complete(result, None)
        elif reason == FAIL_REASON.SUCCESS and isinstance(result, _Rejected):
            complete(None, KraftError(result.code, result.message))
        elif reason in (
            FAIL_REASON.MISSING_LEADER,
            FAIL_REASON.NOT_LEADER,
            FAIL_REASON.LEADER_CHANGED,
            FAIL_REASON.DISCARDED,
        ):
            complete(
                None,
                KraftError(
                    ErrorCode.NOT_CONTROLLER,
                    f"leadership lost before commit (reason {reason}); "
                    + self._not_leader_message(),
                ),
            )
        elif reason == FAIL_REASON.QUEUE_FULL:
            complete(None, KraftError(ErrorCode.THROTTLING_QUOTA_EXCEEDED, "raft queue full"))
        else:
            complete(
                None,
                KraftError(
                    ErrorCode.UNKNOWN_SERVER_ERROR,
                    f"raft failure reason {reason}; the outcome is unknown",
                ),
            )

    def _not_leader_message(self) -> str:
        lid = self.leader_id
        return f"node {self.node_id} is not the leader (leader: {lid if lid is not None else 'unknown'})"

    def _publish(self, state: tuple[bool, int]) -> None:  # trio thread
        alive = []
        for channel in self._subscribers:
            try:
                channel.send_nowait(state)
                alive.append(channel)
            except trio.WouldBlock:
                logger.warning("leadership event subscriber is not keeping up; dropped %s", state)
                alive.append(channel)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        self._subscribers = alive
        self._committer.kick()

    # ---- joining a running quorum -----------------------------------------------------------
    @property
    def join_caught_up(self) -> bool:
        """While joining: a leader was heard from and everything it had committed then is
        applied here (the node then checks the leader's cluster id and calls finish_join)."""
        so = self._so
        target = self._join_target
        return so is not None and target is not None and so.raftLastApplied >= target

    def finish_join(self) -> None:
        """From now on this member campaigns and votes like any voter."""
        if self.joining:
            self.joining = False
            logger.info(
                "raft member %d: caught up to raft index %s from the leader; voting from now on",
                self.node_id,
                self._join_target,
            )

    def _hold_election(self, so: _KraftSyncObj) -> None:
        """A joining member never times out into a campaign."""
        so._SyncObj__raftElectionDeadline = _monotonic() + 10 * self.settings.raft_max_timeout

    def _joining_filter(self, message: dict[str, Any]) -> bool:
        """While joining: False for messages to drop (a vote for a candidate without history:
        two blank members must not elect each other; a leadership transfer to us)."""
        kind = message.get("type")
        if kind == "append_entries":
            if self._join_target is None:
                self._join_target = int(message.get("commit_index") or 0)
            return True
        if kind == "timeout_now":
            return False
        if (
            kind in ("request_vote", PRE_VOTE_REQUEST)
            and int(message.get("last_log_term") or 0) <= 0
        ):
            self._join_refused_votes += 1
            if self._join_refused_votes in (1, 10, 100) or self._join_refused_votes % 1000 == 0:
                logger.warning(
                    "raft member %d: joining (empty or rebuilt directory): refused a vote to a "
                    "candidate without history (%d so far); waiting for a leader of the "
                    "existing cluster",
                    self.node_id,
                    self._join_refused_votes,
                )
            return False
        return True

    def refuses_vote_message(self, message: Any, sender: int | None) -> bool:
        """True for a vote request or grant from a voter whose directory changed and who has
        not caught up since: a wiped voter must not take part in an election as the old one."""
        if sender is None or sender not in self.unverified_voters or not isinstance(message, dict):
            return False
        if message.get("type") not in VOTE_MESSAGES:
            return False
        self._unverified_dropped += 1
        if self._unverified_dropped in (1, 10, 100) or self._unverified_dropped % 1000 == 0:
            logger.warning(
                "raft member %d: ignored a %s from voter %d: its directory id changed (wiped "
                "disk) and it has not caught up yet (%d ignored so far)",
                self.node_id,
                message.get("type"),
                sender,
                self._unverified_dropped,
            )
        return True

    # ---- inside PySyncObj's ticks ------------------------------------------------------------
    def _observe(self) -> None:
        """Leadership watch: called from ``onStateChanged`` and every tick (cheap compare)."""
        so = self._so
        ticks = self._ticks
        if so is None or ticks is None:
            return
        if self.joining:
            self._hold_election(so)
        state = (so._isLeader(), so.raftCurrentTerm)
        if state == self._observed:
            return
        self._observed = state
        logger.info(
            "raft member %d: %s in term %d",
            self.node_id,
            "leader" if state[0] else "not leader",
            state[1],
        )
        ticks.call_after_tick(self._publish, state)

    def _on_peer_message(
        self, node: Any, message: Any, deliver: Callable[[Any, Any], None]
    ) -> None:
        """Keep the leader's nextIndex for a follower from moving backwards on a late ack.

        With ``appendEntriesUseBatch=False`` the leader sends entry k+1 before the follower's
        ack for k arrives; PySyncObj then sets nextIndex back to k+1 and re-sends k+1, and the
        follower truncates and re-appends an entry it may already have applied (a CRITICAL
        "truncating already-applied log entries" log, a journal rewrite and an extra sync).
        A successful ack never needs to lower nextIndex — a follower that misses entries answers
        ``success=False, reset=True`` and PySyncObj repairs from that — so we restore it.
        Reads and writes PySyncObj's private ``__raftNextIndex`` (inside a tick, raft.py only)."""
        so = self._so
        if self.joining and isinstance(message, dict) and not self._joining_filter(message):
            return
        if self.unverified_voters and self.refuses_vote_message(
            message,
            self._addr_to_id.get(cast(str, getattr(node, "id", None))),  # None: no voter
        ):
            return
        if isinstance(message, dict) and message.get("type") == "next_node_idx":
            # An ack can advance the commit index, and the leader counts its own copy: it must
            # be on disk first (it was not synced before replication, see _sync_before_send).
            self._sync_journal()
        if (
            so is None
            or not isinstance(message, dict)
            or message.get("type") != "next_node_idx"
            or not message.get("success")
            or message.get("reset")
        ):
            deliver(node, message)
            return
        next_index = so.next_index()
        before = next_index.get(node)
        deliver(node, message)
        after = next_index.get(node)
        if before is not None and after is not None and after < before and so._isLeader():
            next_index[node] = before

    def _sync_before_send(self, message: Any) -> None:
        """Sync the journal before a message that depends on it leaves this node.

        The exception is the leader's ``append_entries`` (PySyncObj sends them only from its
        append round): they go out first and the leader starts one sync after the round
        (``_SyncObj__sendAppendEntries``, on the syncer thread), so its own write overlaps the
        followers' receive-write-sync-ack instead of preceding it. The leader also syncs before handling
        any follower's ack (``_on_peer_message``): a commit needs acks, so every committed
        entry is on the leader's disk and on the acking followers' disks (they sync before
        their ack). Pre-vote messages promise nothing and change no state: no sync either."""
        if isinstance(message, dict) and message.get("type") in NO_SYNC_MESSAGES:
            return
        self._sync_journal()

    def _sync_journal(self) -> None:
        journal = self._journal
        if journal is not None:
            journal.sync()

    def _apply_committed(self, so: _KraftSyncObj, commands: list[bytes], origin_term: int) -> Any:
        raft_index = so.raftLastApplied + 1  # the entry being applied (PySyncObj increments after)
        term = so.entry_term(raft_index)
        if term is None:
            term = so.raftCurrentTerm
        if term != origin_term:
            self._counters["entries_rejected"] += 1
            return _Rejected(
                ErrorCode.NOT_CONTROLLER,
                f"group submitted in term {origin_term} was committed in term {term}",
            )
        if not self.partners:
            self._sync_journal()  # single member: no outgoing message syncs for us
        try:
            if raft_index <= self.target.last_applied_raft_index():
                self._counters["entries_skipped"] += 1
                return [None] * len(commands)
            results = self.target.apply_entry(raft_index, term, list(commands))
        except Exception as exc:  # never raise into PySyncObj: it would re-apply forever
            self._counters["apply_errors"] += 1
            logger.exception("applying raft entry %d failed", raft_index)
            return _Rejected(ErrorCode.UNKNOWN_SERVER_ERROR, f"apply failed: {exc!r}")
        self._counters["entries_applied"] += 1
        self._heartbeat_if_due(so)  # between entries of a long apply
        return list(results)

    def _heartbeat_if_due(self, so: _KraftSyncObj) -> None:
        """On the leader, send a round of append_entries now if half a heartbeat period has
        passed since the last: PySyncObj applies committed entries inside a tick and sends
        heartbeats only between ticks, so a tick applying a long backlog (large groups, a
        1M-partition broker transition, a busy machine) would otherwise starve the followers
        past their election timeout and cost an election."""
        if so._isLeader() and _monotonic() - self._last_append_round >= self._heartbeat_period / 2:
            so._SyncObj__sendAppendEntries()

    def _write_dump(self, path: str, data: tuple[Any, ...]) -> None:
        """PySyncObj ``serializer(fileName, data)``: ``data`` = (last applied entry, the entry
        before it, cluster nodes); entries are ``(command, raft index, term)``."""
        try:
            last_entry, prev_entry, cluster = data
            snapshot = self.target.dump()
            meta = msgpack.packb(
                {
                    "raft_index": last_entry[1],
                    "term": last_entry[2],
                    "last_entry": [bytes(last_entry[0]), last_entry[1], last_entry[2]],
                    "prev_entry": [bytes(prev_entry[0]), prev_entry[1], prev_entry[2]],
                    "cluster": sorted(str(n.id) for n in cluster),
                },
                use_bin_type=True,
            )
            with open(path, "wb") as f:
                f.write(_DUMP_HEADER.pack(_DUMP_MAGIC, 1, len(meta)))
                f.write(meta)
                f.write(snapshot)
                f.flush()
                if self.settings.fsync == "always":
                    os.fsync(f.fileno())
            self._counters["dumps_written"] += 1
            logger.info(
                "raft member %d: compaction dump at raft index %d (%d bytes snapshot)",
                self.node_id,
                last_entry[1],
                len(snapshot),
            )
        except OSError as exc:
            storage_failed("raft compaction dump write", path, exc)
        except Exception:
            logger.exception("raft member %d: writing the compaction dump failed", self.node_id)
            raise

    def _read_dump(self, path: str) -> tuple[Any, ...]:
        """PySyncObj ``deserializer(fileName)``: install the snapshot in the target unless the
        target is already at or past it; return PySyncObj's bookkeeping tuple."""
        try:
            with open(path, "rb") as f:
                if self.settings.fsync == "always":
                    os.fsync(f.fileno())  # a received dump is written by PySyncObj unsynced
                raw = f.read()
            magic, version, meta_len = _DUMP_HEADER.unpack_from(raw, 0)
            if magic != _DUMP_MAGIC or version != 1:
                raise ValueError(f"{path}: not a pykraft raft dump (magic {magic!r}, v{version})")
            start = _DUMP_HEADER.size
            meta = msgpack.unpackb(raw[start : start + meta_len], raw=False)
            snapshot = raw[start + meta_len :]
            if meta["raft_index"] > self.target.last_applied_raft_index():
                self.target.load(snapshot)
                self._counters["dumps_loaded"] += 1
                logger.info(
                    "raft member %d: installed dump at raft index %d",
                    self.node_id,
                    meta["raft_index"],
                )
            last, prev = meta["last_entry"], meta["prev_entry"]
            cluster = {TCPNode(a) for a in meta["cluster"]}
            return (bytes(last[0]), last[1], last[2]), (bytes(prev[0]), prev[1], prev[2]), cluster
        except Exception:
            logger.exception("raft member %d: loading the raft dump %s failed", self.node_id, path)
            raise


def _node_key(addr: str) -> TCPNode:
    return TCPNode(addr)
