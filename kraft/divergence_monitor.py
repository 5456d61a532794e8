"""The active controller's divergence check: every few seconds it asks each other voter for
its metadata-log head (``DescribeNode``) and judges it against its own log
(:mod:`kraft.divergence`). A voter that starts diverging is bisected (``DescribeNode`` with
``hash_at``) to the first offset where the histories part, and reported once as an ERROR; the
set of divergent voters feeds ``kraft_controller_divergent_voters`` and ``DescribeQuorum``.

Every controller, leader or not, also checks itself: when a majority of the quorum holds a
history that differs from its own (:class:`kraft.divergence.OutlierCheck`), it steps out of
the quorum through ``step_out`` (the node marks its directory and stops), instead of voting and
acknowledging with a log that is not the cluster's."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from kraft.divergence import Bisection, DivergenceTracker, Head, OutlierCheck, Verdict, judge
from kraft.errors import KraftError
from kraft.log.metadata_log import MetadataLog

log = logging.getLogger("kraft.divergence")

CHECK_INTERVAL_S = 5.0
ASK_TIMEOUT_S = 2.0
MAX_PROBES = 48  # a bisection over 2**48 offsets: any log


def parse_head(reply: dict[str, Any]) -> Head | None:
    """The ``log_head`` of a DescribeNode reply (None from a node too old to send one)."""
    head = reply.get("log_head")
    if not isinstance(head, dict):
        return None
    offset, hash_hex = head.get("offset"), head.get("hash")
    if not isinstance(offset, int) or not isinstance(hash_hex, str):
        return None
    return Head(offset, hash_hex)


def head_of(mlog: MetadataLog) -> dict[str, Any]:
    """Our log head as DescribeNode reports it."""
    return {"offset": mlog.next_offset - 1, "hash": mlog.last_hash.hex()}


def hashes_at(mlog: MetadataLog, offsets: Any) -> list[list[Any]]:
    """DescribeNode's ``hash_at`` answer: ``[offset, hash hex | "" (no batch ends there) |
    None (not held)]`` for up to 64 offsets."""
    out: list[list[Any]] = []
    for offset in list(offsets)[:64] if isinstance(offsets, list) else []:
        if isinstance(offset, int) and not isinstance(offset, bool):
            h = mlog.hash_at(offset)
            out.append([offset, None if h is None else h.hex()])
    return out


class DivergenceMonitor:
    """Runs on every controller; checks only while ``is_active()``."""

    def __init__(
        self,
        node_id: int,
        mlog: MetadataLog,
        voters: dict[int, tuple[str, int]],
        credentials: Any,
        is_active: Callable[[], bool],
        step_out: Callable[[str], object] | None = None,
    ) -> None:
        """``step_out(reason)``: called (and expected not to return) when this controller's
        own log differs from a majority's; None: only report others."""
        self.node_id = node_id
        self.log = mlog
        self.voters = {v: a for v, a in voters.items() if v != node_id}
        self.credentials = credentials
        self.is_active = is_active
        self.tracker = DivergenceTracker()
        self.heads: dict[int, Head] = {}
        self.step_out = step_out
        self.outlier = OutlierCheck(len(voters))

    @property
    def divergent(self) -> dict[int, int]:
        """voter id → the first offset where its history differs from ours (-1: not found)."""
        return dict(self.tracker.divergent)

    async def run(self) -> None:
        while True:
            await trio.sleep(CHECK_INTERVAL_S)
            active = self.is_active()
            if not active:
                self.tracker.forget_all()
            async with trio.open_nursery() as nursery:
                if self.step_out is not None:
                    nursery.start_soon(self.check_self)
                if active:
                    for vid in self.voters:
                        nursery.start_soon(self.check, vid)

    async def check_self(self) -> None:
        """Step out when a majority of the quorum diverges from our log (see the module)."""
        verdicts: dict[int, Verdict] = {}

        async def one(vid: int) -> None:
            verdicts[vid] = await self._judge_ours_against(vid)

        async with trio.open_nursery() as nursery:
            for vid in self.voters:
                nursery.start_soon(one, vid)
        if not self.outlier.note(verdicts) or self.step_out is None:
            return
        against = sorted(v for v, verdict in verdicts.items() if verdict is Verdict.DIVERGES)
        first = await self._bisect(against[0], self.log.next_offset - 1)
        self.step_out(
            f"controller {self.node_id}'s metadata log differs from that of voters {against} "
            f"(a majority of the quorum) from offset {first}; it steps out of the quorum"
        )

    async def _judge_ours_against(self, vid: int) -> Verdict:
        """One peer's head judged against our log, or, when the peer is ahead of us, our head
        judged against the peer's log."""
        mine = self.log.next_offset - 1
        reply = await self._ask(vid, {"checksum": False, "hash_at": [mine]})
        head = parse_head(reply) if reply is not None else None
        if head is None or mine < 0:
            return Verdict.UNKNOWN
        if head.offset <= mine:
            return judge(head, self.log.hash_at(head.offset))
        answers = {o: h for o, h in (reply or {}).get("hashes", [])}
        theirs, ours = answers.get(mine), self.log.hash_at(mine)
        if theirs is None or not ours:  # our log may have moved on while we asked: by offset
            return Verdict.UNKNOWN
        return judge(Head(mine, ours.hex()), bytes.fromhex(theirs) if theirs else b"")

    async def _ask(self, vid: int, body: dict[str, Any]) -> dict[str, Any] | None:
        from kraft.rpc.client import ControllerClient

        client = ControllerClient(
            [self.voters[vid]], client_id=f"controller-{self.node_id}", credentials=self.credentials
        )
        try:
            with trio.move_on_after(ASK_TIMEOUT_S):
                reply: dict[str, Any] = await client.call(
                    "DescribeNode", body, timeout=ASK_TIMEOUT_S
                )
                return reply
        except (KraftError, OSError):
            pass
        finally:
            await client.aclose()
        return None

    async def check(self, vid: int) -> None:
        """Judge one voter's head; on a new divergence find where and log it."""
        reply = await self._ask(vid, {"checksum": False})
        head = parse_head(reply) if reply is not None else None
        if head is None:
            return
        self.heads[vid] = head
        ours = self.log.hash_at(head.offset)
        if not self.tracker.note(vid, judge(head, ours)):
            return
        first = await self._bisect(vid, head.offset)
        self.tracker.found_at(vid, first)
        log.error(
            "controller %d: voter %d's metadata log differs from the leader's from offset %d "
            "(its head: offset %d, hash %s…; the leader's batch there: %s). The voter's history "
            "is not the cluster's: rebuild it with `kraft storage recover --from-peers`.",
            self.node_id,
            vid,
            first,
            head.offset,
            head.hash_hex[:16],
            (ours.hex()[:16] + "…") if ours else "no batch ends there",
        )

    async def _bisect(self, vid: int, differ: int) -> int:
        search = Bisection(self.log.start_offset - 1, differ)
        for _ in range(MAX_PROBES):
            probe = search.probe()
            if probe is None:
                break
            found = self.log.batch_end(probe)
            if found is None:
                break
            end, ours = found
            if end >= search.differ:  # no batch of ours ends inside the gap
                break
            reply = await self._ask(vid, {"checksum": False, "hash_at": [end]})
            answers = dict((o, h) for o, h in (reply or {}).get("hashes", []))
            if end not in answers:
                break
            search.result(end, answers[end] == ours.hex())
        return search.first_differing_offset
