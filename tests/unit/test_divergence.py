"""Divergence alarms' pure parts: judging a voter's head against our log, the bisection to the
first differing offset, the tracker that reports each divergence once; and the metadata log's
``batch_end``/``hash_at`` they read."""

from __future__ import annotations

from pathlib import Path

from kraft.divergence import Bisection, DivergenceTracker, Head, OutlierCheck, Verdict, judge
from kraft.log.metadata_log import MetadataLog
from kraft.records import ZERO_HASH, Batch, NoOpRecord, Provenance, batch_hash


def write_log(directory: Path, sizes: list[int], edit_at: int | None = None) -> MetadataLog:
    """A log of batches of ``sizes`` records; the batch at index ``edit_at`` gets another
    provenance (a different history from there on, chain intact)."""
    mlog = MetadataLog.open(directory, fsync="never")
    prev, offset = ZERO_HASH, 0
    for i, n in enumerate(sizes):
        who = "mallory" if i == edit_at else "alice"
        batch = Batch(offset, 1, i + 1, 1000 + i, Provenance(who), prev, (NoOpRecord(),) * n)
        encoded = batch.encode()
        mlog.append_encoded(encoded, batch)
        prev, offset = batch_hash(encoded), offset + n
    return mlog


def test_hash_at_names_batch_ends_only(tmp_path: Path) -> None:
    mlog = write_log(tmp_path, [2, 3, 1])  # batches end at offsets 1, 4, 5
    try:
        assert mlog.hash_at(5) == mlog.last_hash
        end4 = mlog.batch_end(3)
        assert end4 is not None and end4[0] == 4
        assert mlog.hash_at(4) == end4[1]
        assert mlog.hash_at(3) == b""  # inside a batch: no head can end there
        assert mlog.hash_at(6) is None and mlog.hash_at(-1) is None
    finally:
        mlog.close()


def test_judge() -> None:
    ours = bytes(range(32))
    assert judge(Head(4, ours.hex()), ours) is Verdict.AGREES
    assert judge(Head(4, "00" * 32), ours) is Verdict.DIVERGES
    assert judge(Head(3, ours.hex()), b"") is Verdict.DIVERGES  # no batch of ours ends there
    assert judge(Head(9, ours.hex()), None) is Verdict.UNKNOWN  # past our end
    assert judge(Head(-1, ""), ZERO_HASH) is Verdict.AGREES  # both empty


def test_bisection_finds_where_two_real_logs_part(tmp_path: Path) -> None:
    sizes = [1, 2, 1, 3, 1, 1, 2, 1]  # batch ends: 0, 2, 3, 6, 7, 8, 10, 11
    ours = write_log(tmp_path / "a", sizes)
    theirs = write_log(tmp_path / "b", sizes, edit_at=4)  # parts at the batch of offset 7
    try:
        head = theirs.next_offset - 1
        assert judge(Head(head, theirs.last_hash.hex()), ours.hash_at(head)) is Verdict.DIVERGES
        search, probes = Bisection(ours.start_offset - 1, head), 0
        while (probe := search.probe()) is not None:
            found = ours.batch_end(probe)
            assert found is not None
            end, h = found
            if end >= search.differ:
                break
            search.result(end, theirs.hash_at(end) == h)
            probes += 1
        assert search.first_differing_offset == 7
        assert probes <= 4
    finally:
        ours.close()
        theirs.close()


def test_tracker_reports_once_and_clears_on_repair() -> None:
    t = DivergenceTracker()
    assert t.note(3, Verdict.DIVERGES) is True
    t.found_at(3, 17)
    assert t.note(3, Verdict.DIVERGES) is False  # already reported
    assert t.note(3, Verdict.UNKNOWN) is False and t.divergent == {3: 17}
    assert t.note(3, Verdict.AGREES) is False and t.divergent == {}
    assert t.note(3, Verdict.DIVERGES) is True  # diverging again is news again
    t.forget_all()
    assert t.divergent == {}


def test_outlier_only_when_a_majority_diverges_in_a_row() -> None:
    D, A, U = Verdict.DIVERGES, Verdict.AGREES, Verdict.UNKNOWN
    # three voters: a rewritten leader sees both followers diverge; each follower sees only
    # the leader diverge and the other follower agree
    assert OutlierCheck(3).majority_diverges({2: D, 3: D})
    assert not OutlierCheck(3).majority_diverges({1: D, 3: A})
    assert not OutlierCheck(3).majority_diverges({2: D, 3: U})  # silence counts for nobody
    assert not OutlierCheck(3).majority_diverges({})
    # five voters: three of the four others must diverge
    assert not OutlierCheck(5).majority_diverges({2: D, 3: D, 4: A, 5: U})
    assert OutlierCheck(5).majority_diverges({2: D, 3: D, 4: D, 5: A})

    check = OutlierCheck(3, confirmations=2)
    assert not check.note({2: D, 3: D})
    assert not check.note({2: D, 3: U})  # the run is broken: start again
    assert not check.note({2: D, 3: D})
    assert check.note({2: D, 3: D})
