"""The audit's replay (tools/audit/state.py) through damage: after a damaged frame, a missing
stretch or a broken hash chain it goes on from the next readable batch (approximately, or
exactly from a snapshot), skips the batches that do not fit and counts them under the break,
and says the image is approximate and after which offsets."""

from __future__ import annotations

from pathlib import Path

import pytest

from kraft.log.segment import list_segments
from kraft.snapshotter import image_to_snapshot
from tests import tamper
from testsupport.sample_log import Written, write_topics
from tools.audit import state

NAMES = ("a", "b", "c", "d", "e")


def _frame_of(log: Path, offset: int) -> tuple[Path, int]:
    """The segment and frame number of the batch that starts at ``offset``."""
    for seg in list_segments(log):
        for i, (pos, _) in enumerate(tamper.frames(seg)):
            if tamper.base_of(seg, pos) == offset:
                return seg, i
    raise AssertionError(f"no batch starts at {offset}")


def _topics(r: state.Replay) -> list[str]:
    return sorted(t.name for t in r.image.topics_by_id.values())


@pytest.fixture
def written(tmp_path: Path) -> Written:
    return write_topics(tmp_path / "log", NAMES, delete=("c",))


def test_a_clean_log_replays_exactly(written: Written) -> None:
    r = state.replay(written.directory)
    assert r.gaps == [] and r.approximate is None and r.error is None
    assert r.image.checksum() == written.images["deleted:c"].checksum()


def test_after_a_damaged_length_field_the_replay_goes_on(tmp_path: Path) -> None:
    w = write_topics(tmp_path / "log", NAMES)
    lost = w.offset("created:b") + 1  # c's batch
    seg, frame = _frame_of(w.directory, lost)
    pos, offset = tamper.damage_length(seg, frame)
    assert offset == lost
    r = state.replay(w.directory)
    (gap,) = r.gaps
    assert (gap.first, gap.last) == (lost, w.offset("created:c"))
    assert gap.why == f"damaged frame in {seg.name} at byte {pos}"
    assert _topics(r) == ["a", "b", "d", "e"]  # d and e were created after the damage
    assert r.image.offset == w.offset("created:e")
    assert r.error is None and gap.unfit == 0
    assert r.approximate is not None
    assert f"a gap at offsets {lost}..{w.offset('created:c')}" in r.approximate
    doc = state.end_state(r.image, approximate=r.approximate)
    assert doc["approximate"] == r.approximate


def test_batches_that_do_not_fit_are_skipped_and_counted_under_the_gap(written: Written) -> None:
    lost = written.offset("created:b") + 1
    seg, frame = _frame_of(written.directory, lost)
    tamper.damage_length(seg, frame)
    r = state.replay(written.directory)
    (gap,) = r.gaps
    # deleting c, whose creation was lost, does not fit: skipped whole, counted under the gap
    assert gap.unfit == 1 and gap.unfit_records == 1
    assert gap.samples[0]["offset"] == written.offset("deleted:c")
    assert "RemoveTopicRecord" in gap.samples[0]["error"]
    assert _topics(r) == ["a", "b", "d", "e"]
    assert r.image.offset == written.offset("deleted:c")
    assert "1 batch(es), 1 record(s) after it did not fit" in (r.approximate or "")
    assert gap.as_dict()["unfit_batches"] == 1


def test_the_first_intact_snapshot_after_a_gap_makes_the_replay_exact_again(
    written: Written,
) -> None:
    snap = image_to_snapshot(written.directory, written.images["created:e"])
    lost = written.offset("created:b") + 1
    seg, frame = _frame_of(written.directory, lost)
    tamper.damage_length(seg, frame)
    r = state.replay(written.directory)
    (gap,) = r.gaps
    assert gap.resumed.endswith(f"exact again from snapshot {snap.name}")
    assert r.approximate is None
    (cmp,) = r.comparisons
    assert cmp["snapshot"] == snap.name and cmp["match"] is None and "approximate" in cmp["error"]
    assert r.image.checksum() == written.images["deleted:c"].checksum()
    # up to the snapshot the image is approximate
    before = state.replay(written.directory, upto=written.offset("created:d"))
    assert before.approximate is not None and _topics(before) == ["a", "b", "d"]


def test_a_snapshot_ending_where_the_lost_offsets_end_restarts_the_replay_exactly(
    written: Written,
) -> None:
    snap = image_to_snapshot(written.directory, written.images["created:c"])
    lost = written.offset("created:b") + 1
    seg, frame = _frame_of(written.directory, lost)
    tamper.damage_length(seg, frame)
    r = state.replay(written.directory)
    (gap,) = r.gaps
    assert gap.exact and gap.resumed == f"from snapshot {snap.name}: exact again"
    assert r.approximate is None and gap.unfit == 0
    assert r.image.checksum() == written.images["deleted:c"].checksum()


def test_a_damaged_snapshot_is_not_restarted_from(written: Written) -> None:
    snap = image_to_snapshot(written.directory, written.images["created:c"])
    tamper.flip_snapshot_chunk(snap)
    lost = written.offset("created:b") + 1
    seg, frame = _frame_of(written.directory, lost)
    tamper.damage_length(seg, frame)
    r = state.replay(written.directory)
    (gap,) = r.gaps
    assert not gap.exact and r.approximate is not None and gap.unfit == 1


def test_a_missing_segment_is_a_gap_of_its_offsets(written: Written) -> None:
    segs = list_segments(written.directory)
    first, nxt = int(segs[1].name[:20]), int(segs[2].name[:20])
    segs[1].unlink()
    r = state.replay(written.directory)
    (gap,) = r.gaps
    assert (gap.first, gap.last, gap.why) == (first, nxt - 1, "offsets missing")
    assert r.image.offset == written.offset("deleted:c") and r.approximate is not None


def test_an_edited_batch_breaks_the_chain_and_the_replay_goes_on(written: Written) -> None:
    seg, frame = _frame_of(written.directory, written.offset("created:a") + 1)  # b's batch
    tamper.edit_value_recrc(seg, frame)
    r = state.replay(written.directory)
    (gap,) = r.gaps
    nxt = written.offset("created:b") + 1
    assert (gap.first, gap.last) == (nxt, nxt - 1)
    assert gap.why == f"the hash chain breaks at offset {nxt}"
    assert f"approximate after offset {nxt}" in (r.approximate or "")
    assert r.image.topics_by_name.keys() == written.images["deleted:c"].topics_by_name.keys()


def test_a_batch_that_does_not_fit_an_intact_log_is_a_break_of_its_own(
    written: Written,
) -> None:
    created_c = written.offset("created:b") + 1  # c's batch
    batches = [b.base_offset for b in written.batches]
    gone = tamper.rewrite_after_deleting(written.directory, batches.index(created_c))
    assert gone == created_c
    r = state.replay(written.directory)
    (gap,) = r.gaps
    assert gap.why.startswith("a batch does not fit") and gap.unfit == 1
    assert r.error is not None and "RemoveTopicRecord" in r.error
    assert _topics(r) == ["a", "b", "d", "e"]


def test_a_torn_tail_is_no_gap(written: Written) -> None:
    seg = list_segments(written.directory)[-1]
    tamper.cut_mid_batch(seg, len(tamper.frames(seg)) - 1)
    r = state.replay(written.directory)
    assert r.gaps == [] and r.approximate is None
    assert r.image.offset == written.offset("created:e")


def test_state_at_a_point_before_the_gap_is_exact(written: Written) -> None:
    lost = written.offset("created:b") + 1
    seg, frame = _frame_of(written.directory, lost)
    tamper.damage_length(seg, frame)
    r = state.replay(written.directory, upto=written.offset("created:b"))
    assert r.gaps == [] and r.approximate is None
    assert r.image.checksum() == written.images["created:b"].checksum()


def _findings(regions_scan, gaps: list[dict], approximate: str | None) -> dict:
    """findings.json's rules and root causes as run.py builds them before the replay's part."""
    from tools.audit import breaks

    doc = {
        "status": "failed" if regions_scan.findings else "passed",
        "rules": [
            {
                "rule": breaks.RULE,
                "severity": "error",
                "count": 0,
                "errors": 0,
                "warnings": 0,
                "passed": True,
                "samples": [],
            }
        ],
        "root_causes": [
            {**r.finding.as_dict(), "offsets": [r.first, r.last], "consequences": {}}
            for r in regions_scan.regions
        ],
    }
    breaks.attach(doc, regions_scan.regions, gaps, approximate)
    return doc


def test_unfit_batches_are_consequences_of_the_scans_root_cause(written: Written) -> None:
    from tools.audit.integrity import scan_log

    lost = written.offset("created:b") + 1
    seg, frame = _frame_of(written.directory, lost)
    pos, _ = tamper.damage_length(seg, frame)
    r = state.replay(written.directory)
    doc = _findings(scan_log(written.directory), [g.as_dict() for g in r.gaps], r.approximate)
    (cause,) = doc["root_causes"]
    # (the damaged frame may be its segment's last: then the segment reads as cut mid-batch)
    assert cause["rule"] in ("frames-decodable", "segment-intact")
    assert (cause["file"], cause["position"], cause["offsets"]) == (
        seg.name,
        pos,
        [lost, written.offset("created:c")],
    )
    assert cause["consequences"] == {"state-replays": 1}
    assert cause["replay"][0]["unfit_batches"] == 1
    (rule,) = doc["rules"]
    assert (rule["count"], rule["consequences"], rule["root_causes"]) == (1, 1, 0)
    assert rule["samples"][0]["consequence"] is True
    assert doc["replay"]["approximate"] == r.approximate and doc["status"] == "failed"


def test_a_batch_that_does_not_fit_an_intact_log_is_its_own_root_cause(
    written: Written,
) -> None:
    from tools.audit.integrity import scan_log

    c = written.offset("created:b") + 1
    tamper.rewrite_after_deleting(
        written.directory, [b.base_offset for b in written.batches].index(c)
    )
    scan = scan_log(written.directory)
    assert scan.findings == []  # a consistent rewrite: nothing in the structure shows it
    r = state.replay(written.directory)
    doc = _findings(scan, [g.as_dict() for g in r.gaps], r.approximate)
    (cause,) = doc["root_causes"]
    assert cause["rule"] == "state-replays" and cause["consequences"] == {}
    (rule,) = doc["rules"]
    assert (rule["count"], rule["root_causes"], rule["passed"]) == (1, 1, False)
    assert doc["status"] == "failed"
