"""The audit's structure scan (tools/audit/integrity.py) and witnesses (tools/audit/witness.py)
on a generated log damaged in each way of the audit-hardening issue: every damage is a finding
with its check, file, byte position and offset, never an exception."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kraft.log.segment import list_segments
from tests import tamper
from testsupport.sample_log import write_history
from tools.audit import witness
from tools.audit.integrity import frames_resync, scan_log


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("base") / "log"
    tamper.sample(d, ("created", "fenced"))
    return d


@pytest.fixture
def log(base: Path, tmp_path: Path) -> Path:
    return tamper.copy(base, tmp_path / "log")


def _only(log: Path, rule: str) -> dict:
    scan = scan_log(log)
    found = [f.as_dict() for f in scan.findings]
    assert [f["rule"] for f in found] == [rule], found
    return found[0]


def test_a_clean_log_has_no_findings(base: Path) -> None:
    scan = scan_log(base)
    assert scan.findings == [] and scan.regions == []
    assert scan.records == 23 and scan.head["offset"] == 22
    assert [c["term"] for c in scan.controller_changes()] == [2]


def test_a_flipped_byte_in_a_snapshot_chunk(log: Path) -> None:
    snap = sorted(log.glob("*.checkpoint"))[0]
    pos = tamper.flip_snapshot_chunk(snap)
    f = _only(log, "snapshot-intact")
    assert (f["file"], f["position"], f["severity"]) == (snap.name, pos, "error")
    assert f["offset"] == int(snap.name[:20]) - 1 and "CRC" in f["detail"]


def test_a_flipped_byte_in_a_snapshot_footer(log: Path) -> None:
    snap = sorted(log.glob("*.checkpoint"))[1]
    pos = tamper.flip_snapshot_footer(snap)
    f = _only(log, "snapshot-intact")
    assert (f["file"], f["position"]) == (snap.name, pos)


def test_a_resealed_snapshot_forgery(log: Path) -> None:
    snap = sorted(log.glob("*.checkpoint"))[0]
    tamper.forge_snapshot_leader(snap)
    f = _only(log, "snapshot-intact")
    assert (f["file"], f["position"], f["offset"]) == (snap.name, 0, int(snap.name[:20]) - 1)
    assert "resealed" in f["detail"]


def test_a_middle_segment_cut_mid_batch_is_an_error_with_the_lost_offsets(log: Path) -> None:
    seg = list_segments(log)[1]
    nxt = int(list_segments(log)[2].name[:20])
    pos, offset = tamper.cut_mid_batch(seg)
    scan = scan_log(log)
    f = _only(log, "segment-intact")
    assert (f["severity"], f["file"], f["position"], f["offset"]) == (
        "error",
        seg.name,
        pos,
        offset,
    )
    assert f"offsets {offset}..{nxt - 1} lost" in f["detail"]
    assert scan.records == 23 - (nxt - offset)  # the cut frame is not counted


def test_the_torn_tail_of_the_newest_segment_is_a_warning_not_a_record(log: Path) -> None:
    seg = list_segments(log)[-1]
    pos, offset = tamper.cut_mid_batch(seg)
    scan = scan_log(log)
    f = _only(log, "segment-intact")
    assert (f["severity"], f["position"], f["offset"]) == ("warning", pos, offset)
    assert scan.records == offset and scan.head["offset"] == offset - 1


def test_after_a_damaged_length_field_the_scan_resynchronises(log: Path) -> None:
    seg = list_segments(log)[1]
    n = len(tamper.frames(seg))
    pos, offset = tamper.damage_length(seg)
    scan = scan_log(log)
    f = _only(log, "frames-decodable")
    assert (f["file"], f["position"], f["offset"]) == (seg.name, pos, offset)
    assert f"offsets {offset}..{offset} lost" in f["detail"] and "bytes" in f["detail"]
    assert scan.records == 22  # every batch after the damaged one is still read
    # the audit's decoder splits the segment the same way
    frames = list(frames_resync(seg.read_bytes()))
    assert sum(1 for fr in frames if fr.crc_ok) == n - 1


def test_an_edited_value_with_a_fresh_crc_blames_the_edited_batch(log: Path) -> None:
    seg = list_segments(log)[1]
    pos, offset = tamper.edit_value_recrc(seg)
    f = _only(log, "hash-chain")
    assert (f["file"], f["position"], f["offset"]) == (seg.name, pos, offset)
    assert "content changed" in f["detail"]


def test_a_flipped_byte_in_a_frame_is_a_crc_finding(log: Path) -> None:
    seg = list_segments(log)[1]
    pos, end = tamper.frames(seg)[1]
    offset = tamper.base_of(seg, pos)
    tamper.flip(seg, (pos + end) // 2)
    f = _only(log, "crc-intact")
    assert (f["position"], f["offset"]) == (pos, offset)
    assert scan_log(log).records == 22


def test_a_deleted_middle_segment_is_one_root_cause_region(log: Path) -> None:
    segs = list_segments(log)
    first, nxt = int(segs[1].name[:20]), int(segs[2].name[:20])
    segs[1].unlink()
    scan = scan_log(log)
    f = _only(log, "offsets-contiguous")
    assert (f["file"], f["position"], f["offset"]) == (segs[2].name, 0, first)
    assert [(r.first, r.last) for r in scan.regions] == [(first, nxt - 1)]


def test_an_empty_segment_file(log: Path) -> None:
    segs = list_segments(log)
    first, nxt = int(segs[1].name[:20]), int(segs[2].name[:20])
    segs[1].write_bytes(b"")
    f = _only(log, "segment-intact")
    assert (f["file"], f["position"], f["offset"]) == (segs[1].name, 0, first)
    assert f"offsets {first}..{nxt - 1} lost" in f["detail"]


def test_a_flipped_byte_in_a_segment_index(log: Path) -> None:
    seg = list_segments(log)[1]
    index = tamper.write_index(seg)
    assert scan_log(log).findings == []
    tamper.flip(index, 12)  # entry 1's position
    f = _only(log, "index-consistent")
    assert (f["file"], f["position"]) == (index.name, 8)


def test_a_cut_at_a_batch_boundary_in_the_middle_shows_as_a_gap(log: Path) -> None:
    seg = list_segments(log)[1]
    offset = tamper.cut_at_boundary(seg, 1)
    f = _only(log, "offsets-contiguous")
    assert f["offset"] == offset


def test_undetectable_alone_detected_by_a_witness_and_by_the_previous_head(
    log: Path, base: Path, tmp_path: Path
) -> None:
    """A rewrite that re-chains every later batch, and a cut at a batch boundary of the
    newest segment, leave a consistent log: another controller's copy and the head an
    earlier audit verified catch them."""
    clean = scan_log(base)
    dropped = tamper.rewrite_after_deleting(log, 5)
    forged = scan_log(log)
    assert forged.findings == []
    found = witness.compare(forged, [clean])
    assert {f.rule for f in found} == {"witness-agrees"}
    assert any(f.severity == "error" and f.offset == dropped for f in found), found
    assert witness.against_previous(forged, clean.head)[0].rule == "history-unchanged"

    cut = tamper.copy(base, tmp_path / "cut")
    offset = tamper.cut_at_boundary(list_segments(cut)[-1], 1)
    short = scan_log(cut)
    assert short.findings == []
    (lag,) = witness.compare(short, [clean])
    assert (lag.rule, lag.severity, lag.offset) == ("witness-agrees", "error", offset)
    (gone,) = witness.against_previous(short, clean.head)
    assert "truncated" in gone.detail
    # and a witness that lags is only a warning; agreeing copies say nothing
    (behind,) = witness.compare(clean, [short])
    assert behind.severity == "warning"
    assert witness.compare(clean, [scan_log(base)]) == []


def test_previous_head_is_read_from_an_earlier_findings_file(tmp_path: Path) -> None:
    log = tmp_path / "log"
    write_history(log)
    doc = tmp_path / "findings.json"
    doc.write_text(json.dumps({"log_dir": str(log), "verified_head": {"offset": 3, "hash": "ab"}}))
    assert witness.previous_head(None, doc, log) == {"offset": 3, "hash": "ab"}
    assert witness.previous_head(None, doc, tmp_path / "other") is None  # another log's
    doc.write_text("{not json")
    assert witness.previous_head(None, doc, log) is None
    with pytest.raises(witness.PreviousError):
        witness.previous_head(doc, doc, log)  # given explicitly: a clear error


def test_log_dump_catches_a_resealed_snapshot(log: Path) -> None:
    """``kraft log dump`` rebuilds each snapshot's image from its records and compares it with
    the header's checksum, for the directory and for the file alone."""
    from tools.commands.log_cmd import dump_items

    snap = sorted(log.glob("*.checkpoint"))[0]
    assert [i for i in dump_items(log) if i["kind"] == "problem"] == []
    tamper.forge_snapshot_leader(snap)
    for path in (log, snap):
        items = list(dump_items(path))
        (problem,) = [i for i in items if i["kind"] == "problem"]
        assert problem["file"] == str(snap) and "checksum" in problem["detail"]
        assert items[-1]["problems"] == 1
