"""Divergence alarms: does another voter's metadata log agree with ours?

Kafka has no such check; the hash chain makes it cheap. Every voter reports its log head (the
offset of its last record and the hash of the batch ending there). The leader compares that
hash with the hash of its own batch ending at the same offset: a different hash, or no batch
boundary there at all, means the two histories differ at or before that offset. Heads the
leader cannot judge (past its end, or before its start after retention) are left alone.

Pure: the caller reads the logs and asks the voters; this module decides and remembers what it
has already reported, so an alarm is logged once per voter and divergence, not every check.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Verdict(Enum):
    AGREES = "agrees"
    DIVERGES = "diverges"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Head:
    """A voter's log head: its last record's offset and the hash of the batch ending there."""

    offset: int
    hash_hex: str


def judge(head: Head, ours: bytes | None) -> Verdict:
    """``ours``: our hash of the batch ending at ``head.offset`` (``MetadataLog.hash_at``:
    None = cannot say, ``b""`` = no batch of ours ends there)."""
    if head.offset < 0:
        return Verdict.AGREES if ours is not None else Verdict.UNKNOWN  # both empty
    if ours is None:
        return Verdict.UNKNOWN
    return Verdict.AGREES if ours and ours.hex() == head.hash_hex else Verdict.DIVERGES


class Bisection:
    """The search for where two histories part: ``agree`` is an offset both logs hold the same
    batch ending at (``start - 1`` to begin with), ``differ`` one where they do not (the
    diverging head). Each probe halves the gap; the histories part in ``(agree, differ]``."""

    def __init__(self, agree: int, differ: int) -> None:
        self.agree = agree
        self.differ = differ

    def probe(self) -> int | None:
        """The next offset to compare (a batch end of ours chosen by the caller at or after
        it), or None when the gap is closed."""
        if self.differ - self.agree <= 1:
            return None
        return (self.agree + self.differ) // 2

    def result(self, offset: int, same: bool) -> None:
        """What the comparison at ``offset`` (the batch end actually compared) showed."""
        if same:
            self.agree = max(self.agree, offset)
        else:
            self.differ = min(self.differ, offset)

    @property
    def first_differing_offset(self) -> int:
        return self.agree + 1


class DivergenceTracker:
    """The voters currently diverging from this leader, and at which offset each was found.

    :meth:`note` returns True only when a voter starts diverging, which is when the caller
    looks for where and logs the ERROR; a voter that agrees again (repaired) is cleared."""

    def __init__(self) -> None:
        self.divergent: dict[int, int] = {}

    def note(self, node_id: int, verdict: Verdict) -> bool:
        """Record a check of ``node_id``'s head; True when it has just started diverging."""
        if verdict is Verdict.AGREES:
            self.divergent.pop(node_id, None)
            return False
        if verdict is Verdict.UNKNOWN or node_id in self.divergent:
            return False
        self.divergent[node_id] = -1  # where: see found_at
        return True

    def found_at(self, node_id: int, offset: int) -> None:
        """The first offset at which ``node_id``'s history differs from ours."""
        if node_id in self.divergent:
            self.divergent[node_id] = offset

    def forget_all(self) -> None:
        """Leadership lost: another leader judges now."""
        self.divergent.clear()


class OutlierCheck:
    """Does a majority of the quorum hold a history that differs from ours? Then this voter,
    not the others, is the one whose metadata log is wrong, and it must step out of the quorum
    rather than go on voting and acknowledging with a history that is not the cluster's.

    Each check collects one verdict per other voter: each peer's head judged against our log,
    or our head judged against the peer's log when the peer is ahead of us. Only verdicts
    that say DIVERGES count against us; a voter that did not answer, or an offset one side
    cannot judge, counts for nobody. The quorum of ``voters`` (all voters, us included) must
    have a majority diverging from us in ``confirmations`` checks in a row: a leader whose log
    was rewritten sees both followers diverge and steps out; each follower sees only the leader
    diverge, with the other follower agreeing, and stays."""

    def __init__(self, voters: int, confirmations: int = 2) -> None:
        self.voters = voters
        self.confirmations = confirmations
        self.in_a_row = 0

    def majority_diverges(self, verdicts: dict[int, Verdict]) -> bool:
        against = sum(v is Verdict.DIVERGES for v in verdicts.values())
        return against > self.voters // 2

    def note(self, verdicts: dict[int, Verdict]) -> bool:
        """Record one check's verdicts; True once a majority diverged ``confirmations`` times
        in a row (then this voter must step out)."""
        self.in_a_row = self.in_a_row + 1 if self.majority_diverges(verdicts) else 0
        return self.in_a_row >= self.confirmations
