"""Raft pre-vote and leader stickiness (Raft thesis 9.6; KRaft has both since KIP-996).

Stock PySyncObj starts an election as soon as a follower's timer expires: it bumps its term and
asks for votes, and the higher term makes a healthy leader step down. One follower starved of
CPU for longer than the election timeout thus costs the whole quorum an election. Here:

* **Pre-vote.** A member whose election timer expires first sends ``pre_vote_request`` (the term
  it would campaign in, its last log index and term) without changing its own term. Only when
  a majority (itself included) grants does it take the next term and send the real
  ``request_vote``. A failed round just re-arms the timer.
* **Grant rule** (:func:`grant_pre_vote`): the proposed term is above ours, the candidate's log
  is at least as up to date as ours, and we have not heard from a live leader within the
  minimum election timeout (a leader counts as live to itself while a majority answered it
  that recently).
* **Stickiness** (:func:`sticky`): a follower ignores a real ``request_vote`` at a higher term
  (no term change, no vote) while it hears from a live leader.
  An election started by a leadership transfer (``timeout_now``) skips pre-vote and flags its
  request (``leadership_transfer``) so stickiness lets it through.
* A rejection carries the voter's term; a candidate behind it adopts that term (as a follower),
  so members with stale terms cannot block each other's pre-votes forever. A leader asked for
  a pre-vote by a member already in a higher term steps down to that term: that member lost
  an election after a won pre-vote and ignores the leader's lower-term appends.

Wire compatibility: the two new message types are ignored by a PySyncObj without this module
(its handler matches known types only), and the extra ``leadership_transfer`` key is unread by
it. In a mixed quorum a member without pre-vote still campaigns the stock way, and members with
it grant its real votes once they stop hearing from the leader, so a leader is still elected.
Nothing here touches the Raft log. Installed by ``pysyncobj_patches.apply``; a ``SyncObj`` whose
``kraft_prevote`` attribute is False behaves like stock PySyncObj (tests of mixed quorums).
"""

from __future__ import annotations

import logging
import random
from typing import Any

from pysyncobj.monotonic import monotonic as _monotonic
from pysyncobj.syncobj import _RAFT_STATE, SyncObj

logger = logging.getLogger("kraft.quorum.raft")

PRE_VOTE_REQUEST = "pre_vote_request"
PRE_VOTE_RESPONSE = "pre_vote_response"
TRANSFER_FLAG = "leadership_transfer"

_ORIGINAL_TICK = SyncObj._onTick
_ORIGINAL_ON_MESSAGE = SyncObj._SyncObj__onMessageReceived
_ORIGINAL_ON_NODE_DISCONNECTED = SyncObj._SyncObj__onNodeDisconnected

# A follower whose connection to the leader closes campaigns within this fraction of the
# minimum election timeout (random, so that two followers seldom start together).
EARLY_ELECTION_SPREAD = 0.25


def log_up_to_date(
    candidate_last_term: int, candidate_last_index: int, last_term: int, last_index: int
) -> bool:
    """Raft's election restriction: the candidate's last entry is at least as recent as ours."""
    if candidate_last_term != last_term:
        return candidate_last_term > last_term
    return candidate_last_index >= last_index


def leader_recent(since_leader_contact: float | None, min_election_timeout: float) -> bool:
    """Whether a live leader was heard from within the minimum election timeout (None: never)."""
    return since_leader_contact is not None and since_leader_contact < min_election_timeout


def grant_pre_vote(
    *,
    proposed_term: int,
    candidate_last_term: int,
    candidate_last_index: int,
    current_term: int,
    last_term: int,
    last_index: int,
    since_leader_contact: float | None,
    min_election_timeout: float,
) -> bool:
    """The pre-vote decision (pure): grant only a candidate that would campaign in a term above
    ours, whose log is at least as up to date as ours, while no live leader was heard from
    within the minimum election timeout."""
    return (
        proposed_term > current_term
        and log_up_to_date(candidate_last_term, candidate_last_index, last_term, last_index)
        and not leader_recent(since_leader_contact, min_election_timeout)
    )


def sticky(
    *,
    request_term: int,
    current_term: int,
    is_leader: bool,
    transfer: bool,
    since_leader_contact: float | None,
    min_election_timeout: float,
) -> bool:
    """Whether a follower ignores a real vote request (pure): it would raise our term while a
    live leader is heard from, and it is not a leadership transfer. The leader itself is never
    sticky: a member stuck in a higher term (it won a pre-vote, then lost the election as the
    leader came back) ignores the leader's lower-term appends, and only the leader stepping
    up to that term brings it back."""
    return (
        not is_leader
        and request_term > current_term
        and not transfer
        and leader_recent(since_leader_contact, min_election_timeout)
    )


def early_deadline(deadline: float, now: float, min_election_timeout: float, draw: float) -> float:
    """A follower's election deadline once its connection to the leader closed (pure;
    ``draw`` in [0, 1)): within ``EARLY_ELECTION_SPREAD`` of the minimum timeout from ``now``,
    never later than it already was. A closed connection is what a leader's crash looks like
    (its kernel closes its sockets), so there is no point in waiting out the whole timeout;
    a leader that is alive answers again and its next append pushes the deadline back."""
    return min(deadline, now + draw * EARLY_ELECTION_SPREAD * min_election_timeout)


def majority_contact_age(now: float, response_times: list[float], members: int) -> float | None:
    """A leader's view of its own liveness: how long ago the last of a majority (itself
    included) answered it; None when fewer than a majority ever did."""
    needed = members // 2  # answers from others needed besides the leader's own
    if needed == 0:
        return 0.0
    latest = sorted(response_times, reverse=True)
    if len(latest) < needed:
        return None
    return now - latest[needed - 1]


COUNTERS = (
    "kraft_pre_vote_rounds",
    "kraft_pre_votes_refused",
    "kraft_sticky_refusals",
    "kraft_leader_disconnects",
)


def counters(so: Any) -> dict[str, int]:
    """Pre-vote rounds started, pre-votes refused, vote requests ignored by stickiness, and
    closed connections to the leader that brought the election deadline forward."""
    return {name.removeprefix("kraft_"): int(getattr(so, name, 0)) for name in COUNTERS}


# ---- inside PySyncObj (name-mangled private members of pysyncobj 0.3.17) ----------------------


def _enabled(so: Any) -> bool:
    return bool(getattr(so, "kraft_prevote", True)) and so._SyncObj__selfNode is not None


def _since_leader_contact(so: Any, now: float) -> float | None:
    if so._SyncObj__raftState == _RAFT_STATE.LEADER:
        times = [so._SyncObj__lastResponseTime.get(n, 0.0) for n in so._SyncObj__otherNodes]
        return majority_contact_age(now, times, len(so._SyncObj__otherNodes) + 1)
    contact = getattr(so, "kraft_leader_contact", None)
    if contact is None or so._SyncObj__raftLeader is None:
        return None
    return now - float(contact)


def _min_timeout(so: Any) -> float:
    return float(so._SyncObj__conf.raftMinTimeout)


def _last_log(so: Any) -> tuple[int, int]:
    """(last log term, last log index)."""
    last = so._SyncObj__raftLog[-1]
    return int(last[2]), int(last[1])


def _majority(so: Any, count: int) -> bool:
    return count > (len(so._SyncObj__otherNodes) + 1) / 2


def _on_tick(so: Any, timeToWait: float = 0.0) -> None:
    """``SyncObj._onTick``: an expired election timer starts a pre-vote round (or, for a
    leadership transfer, the election at once) instead of PySyncObj's own election."""
    if _enabled(so) and so._SyncObj__raftState in (_RAFT_STATE.FOLLOWER, _RAFT_STATE.CANDIDATE):
        now = _monotonic()
        if so._SyncObj__raftElectionDeadline < now and so._SyncObj__connectedToAnyone():
            so._SyncObj__raftElectionDeadline = now + so._SyncObj__generateRaftTimeout()
            if so._SyncObj__transferInProgress:
                _start_election(so, transfer=True)
            else:
                _start_pre_vote(so)
    _ORIGINAL_TICK(so, timeToWait)


def _start_pre_vote(so: Any) -> None:
    proposed = so.raftCurrentTerm + 1
    so.kraft_pre_vote_rounds = getattr(so, "kraft_pre_vote_rounds", 0) + 1
    so.kraft_pre_vote_term = proposed
    so.kraft_pre_votes = {so._SyncObj__selfNode}
    last_term, last_index = _last_log(so)
    if _majority(so, 1):  # a single member
        _start_election(so, transfer=False)
        return
    for node in so._SyncObj__otherNodes:
        so._SyncObj__transport.send(
            node,
            {
                "type": PRE_VOTE_REQUEST,
                "term": proposed,
                "candidate_term": so.raftCurrentTerm,
                "last_log_index": last_index,
                "last_log_term": last_term,
            },
        )


def _start_election(so: Any, *, transfer: bool) -> None:
    """PySyncObj's election start (candidate, next term, vote for self, request votes), with
    the transfer flag on the requests."""
    so.kraft_pre_vote_term = None
    so._SyncObj__transferInProgress = False
    so._SyncObj__raftLeader = None
    so._SyncObj__setState(_RAFT_STATE.CANDIDATE)
    so._SyncObj__setCurrentTerm(so.raftCurrentTerm + 1, so._SyncObj__selfNode.id)
    so._SyncObj__votesCount = 1
    last_term, last_index = _last_log(so)
    request: dict[str, Any] = {
        "type": "request_vote",
        "term": so.raftCurrentTerm,
        "last_log_index": last_index,
        "last_log_term": last_term,
    }
    if transfer:
        request[TRANSFER_FLAG] = True
    for node in so._SyncObj__otherNodes:
        so._SyncObj__transport.send(node, dict(request))
    so._SyncObj__onLeaderChanged()
    if _majority(so, so._SyncObj__votesCount):
        so._SyncObj__onBecomeLeader()


def _on_message(so: Any, node: Any, message: Any) -> None:
    """``SyncObj.__onMessageReceived``: answers and counts pre-votes, ignores vote requests
    that would depose a live leader, and notes when the leader was last heard from."""
    if not isinstance(message, dict) or not _enabled(so):
        _ORIGINAL_ON_MESSAGE(so, node, message)
        return
    kind = message.get("type")
    now = _monotonic()
    if kind == PRE_VOTE_REQUEST:
        _answer_pre_vote(so, node, message, now)
        return
    if kind == PRE_VOTE_RESPONSE:
        _count_pre_vote(so, node, message)
        return
    if kind == "request_vote" and sticky(
        request_term=int(message.get("term", 0)),
        current_term=so.raftCurrentTerm,
        is_leader=so._SyncObj__raftState == _RAFT_STATE.LEADER,
        transfer=bool(message.get(TRANSFER_FLAG)),
        since_leader_contact=_since_leader_contact(so, now),
        min_election_timeout=_min_timeout(so),
    ):
        so.kraft_sticky_refusals = getattr(so, "kraft_sticky_refusals", 0) + 1
        return
    if kind == "append_entries" and int(message.get("term", -1)) >= so.raftCurrentTerm:
        so.kraft_leader_contact = now
    _ORIGINAL_ON_MESSAGE(so, node, message)


def _on_node_disconnected(so: Any, node: Any) -> None:
    """``SyncObj.__onNodeDisconnected``: when a follower's connection to its leader closes,
    the leader no longer counts as heard from (this member grants pre-votes) and the election
    deadline comes forward (:func:`early_deadline`). The pre-vote still needs a majority, so a
    member that alone lost its connection to a live leader disturbs nothing."""
    _ORIGINAL_ON_NODE_DISCONNECTED(so, node)
    if not (
        _enabled(so)
        and so._SyncObj__raftState == _RAFT_STATE.FOLLOWER
        and node == so._SyncObj__raftLeader
    ):
        return
    now = _monotonic()
    so.kraft_leader_contact = None
    so.kraft_leader_disconnects = getattr(so, "kraft_leader_disconnects", 0) + 1
    so._SyncObj__raftElectionDeadline = early_deadline(
        so._SyncObj__raftElectionDeadline, now, _min_timeout(so), random.random()
    )
    logger.info("raft: the connection to the leader closed; campaigning early unless it returns")


def _answer_pre_vote(so: Any, node: Any, message: dict[str, Any], now: float) -> None:
    candidate_term = int(message.get("candidate_term", 0))
    if so._SyncObj__raftState == _RAFT_STATE.LEADER and candidate_term > so.raftCurrentTerm:
        # The candidate is stuck in a higher term (it ignores our appends): Raft's rule on a
        # higher term, step down to it, or that member never rejoins.
        logger.warning(
            "raft: a member is in term %d above ours (%d): stepping down to it",
            candidate_term,
            so.raftCurrentTerm,
        )
        so._SyncObj__setCurrentTerm(candidate_term, None)
        so._SyncObj__setState(_RAFT_STATE.FOLLOWER)
        so._SyncObj__raftLeader = None
    last_term, last_index = _last_log(so)
    proposed = int(message.get("term", 0))
    granted = grant_pre_vote(
        proposed_term=proposed,
        candidate_last_term=int(message.get("last_log_term", 0)),
        candidate_last_index=int(message.get("last_log_index", 0)),
        current_term=so.raftCurrentTerm,
        last_term=last_term,
        last_index=last_index,
        since_leader_contact=_since_leader_contact(so, now),
        min_election_timeout=_min_timeout(so),
    )
    if not granted:
        so.kraft_pre_votes_refused = getattr(so, "kraft_pre_votes_refused", 0) + 1
    so._SyncObj__transport.send(
        node,
        {
            "type": PRE_VOTE_RESPONSE,
            "term": proposed,
            "granted": granted,
            "current_term": so.raftCurrentTerm,
        },
    )


def _count_pre_vote(so: Any, node: Any, message: dict[str, Any]) -> None:
    proposed = getattr(so, "kraft_pre_vote_term", None)
    if proposed is None or so._SyncObj__raftState == _RAFT_STATE.LEADER:
        return
    voter_term = int(message.get("current_term", 0))
    if voter_term > so.raftCurrentTerm:  # we are behind: catch up, this round is void
        so.kraft_pre_vote_term = None
        so._SyncObj__setCurrentTerm(voter_term, None)
        so._SyncObj__setState(_RAFT_STATE.FOLLOWER)
        return
    if int(message.get("term", -1)) != proposed or proposed != so.raftCurrentTerm + 1:
        return
    if not message.get("granted"):
        return
    votes: set[Any] = so.kraft_pre_votes
    votes.add(node)
    if _majority(so, len(votes)):
        logger.info(
            "raft: pre-vote won (%d of %d), campaigning in term %d",
            len(votes),
            len(so._SyncObj__otherNodes) + 1,
            proposed,
        )
        _start_election(so, transfer=False)


# (owner, member, replacement) for pysyncobj_patches.PATCHES
PATCHES: tuple[tuple[Any, str, Any], ...] = (
    (SyncObj, "_onTick", _on_tick),
    (SyncObj, "_SyncObj__onMessageReceived", _on_message),
    (SyncObj, "_SyncObj__onNodeDisconnected", _on_node_disconnected),
)
# Private instance attributes read or set above (pysyncobj_patches.USED_INSTANCE_ATTRIBUTES)
USED_INSTANCE_ATTRIBUTES = (
    "_SyncObj__selfNode",
    "_SyncObj__raftState",
    "_SyncObj__otherNodes",
    "_SyncObj__raftLeader",
    "_SyncObj__conf",
    "_SyncObj__transport",
    "_SyncObj__transferInProgress",
    "_SyncObj__votesCount",
)
# Private members read or called above (checked by pysyncobj_patches.missing_members)
USED_CLASS_MEMBERS: tuple[tuple[Any, str], ...] = (
    (SyncObj, "_SyncObj__connectedToAnyone"),
    (SyncObj, "_SyncObj__generateRaftTimeout"),
    (SyncObj, "_SyncObj__setState"),
    (SyncObj, "_SyncObj__setCurrentTerm"),
    (SyncObj, "_SyncObj__onLeaderChanged"),
    (SyncObj, "_SyncObj__onBecomeLeader"),
)
