"""End-to-end ``run_audit`` on damaged copies of a generated log: no damage ends in a
traceback; each is a finding (check, file, byte position, offset) in findings.json, the report
is written and the exit code is the failure code. Several damages share one log (one audit
run) to keep Spark time small; the structure scan's cases one by one are in
tests/unit/test_audit_integrity.py. Also: the report is the same under any local time zone."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")

from kraft.log.segment import list_segments
from tests import tamper
from tests.spark_fixture import module_spark
from testsupport.sample_log import write_topics

pytestmark = [pytest.mark.timeout(600), pytest.mark.spark]

spark = module_spark("local[2]", "kraft-audit-tamper-test")


def _audit(spark, log: Path, out: Path, witnesses=(), state_at: int | None = None):
    from tools.audit.run import AuditOptions, run_audit

    lines: list[str] = []
    result = run_audit(
        AuditOptions(log, out, witnesses=list(witnesses), state_at_offset=state_at),
        spark=spark,
        progress=lines.append,
    )
    doc = json.loads((out / "findings.json").read_text())
    assert (out / "report.html").exists()
    return result, doc, "\n".join(lines)


def _causes(doc: dict, rule: str) -> list[dict]:
    return [c for c in doc["root_causes"] if c["rule"] == rule]


def test_many_damages_in_one_log_each_a_finding(spark, tmp_path):
    log = tmp_path / "log"
    tamper.sample(log, ("created", "fenced"))
    snaps = sorted(log.glob("*.checkpoint"))
    segs = list_segments(log)
    chunk = tamper.flip_snapshot_chunk(snaps[0])
    tamper.forge_snapshot_leader(snaps[1])
    index = tamper.write_index(segs[0])
    tamper.flip(index, 12)
    edited_pos, edited = tamper.edit_value_recrc(segs[0], 2)
    length_pos, length_off = tamper.damage_length(segs[2], 1)
    torn_pos, torn_off = tamper.cut_mid_batch(segs[-1])

    result, doc, text = _audit(spark, log, tmp_path / "out")
    assert result.exit_code == 1 and doc["status"] == "failed", text
    got = {
        (c["rule"], c["file"], c["position"], c["offset"], c["severity"])
        for c in doc["root_causes"]
    }
    assert ("snapshot-intact", snaps[0].name, chunk, int(snaps[0].name[:20]) - 1, "error") in got
    assert ("snapshot-intact", snaps[1].name, 0, int(snaps[1].name[:20]) - 1, "error") in got
    assert ("index-consistent", index.name, 8, 6, "error") in got or any(
        c[0] == "index-consistent" and c[1] == index.name and c[2] == 8 for c in got
    )
    assert ("hash-chain", segs[0].name, edited_pos, edited, "error") in got
    assert ("frames-decodable", segs[2].name, length_pos, length_off, "error") in got
    assert ("segment-intact", segs[-1].name, torn_pos, torn_off, "warning") in got
    # the replay goes on past every break, the first the edited batch's chain, and says so
    assert doc["replay_error"] is None
    gaps = doc["replay"]["gaps"]
    assert gaps[0]["why"] == f"the hash chain breaks at offset {gaps[0]['offsets'][0]}", gaps
    assert doc["end_state"]["approximate"] == doc["replay"]["approximate"] is not None
    # damaged frames are not records: the damaged length and the torn tail lost one batch each
    assert doc["records"] == 23 - 2
    assert doc["head"]["offset"] == torn_off - 1
    assert doc["verified_head"] is None  # a damaged log verifies no head
    assert "Root causes" in (tmp_path / "out" / "report.html").read_text()


def test_after_a_damaged_length_field_the_end_state_holds_what_came_after(spark, tmp_path):
    """A damaged length field in the middle of a segment: the root cause names the check, the
    bytes and the offsets lost; the replay goes on, so the end state (and --state-at) holds
    the topics created after the damage and says it is approximate after the gap."""
    names = ("a", "b", "c", "d", "e", "f")
    w = write_topics(tmp_path / "log", names, delete=("c",), segment_bytes=1 << 20)
    lost, lost_to = w.offset("created:b") + 1, w.offset("created:c")
    seg = next(
        s
        for s in list_segments(w.directory)
        if any(tamper.base_of(s, p) == lost for p, _ in tamper.frames(s))
    )
    frame_no = [tamper.base_of(seg, p) for p, _ in tamper.frames(seg)].index(lost)
    assert frame_no + 1 < len(tamper.frames(seg))  # a frame follows it in the segment
    pos, _ = tamper.damage_length(seg, frame_no)
    end = w.offset("deleted:c")
    result, doc, text = _audit(spark, w.directory, tmp_path / "out", state_at=end)
    assert result.exit_code == 1 and doc["status"] == "failed", text
    (cause,) = _causes(doc, "frames-decodable")
    assert (cause["file"], cause["position"], cause["offset"]) == (seg.name, pos, lost)
    assert cause["offsets"] == [lost, lost_to]
    assert (
        f"offsets {lost}..{lost_to} lost" in cause["detail"] and f"bytes {pos}.." in cause["detail"]
    )
    # deleting c (created in the lost batch) does not fit: a consequence, not a root cause
    assert cause["consequences"].get("state-replays") == 1
    (gap,) = cause["replay"]
    assert gap["offsets"] == [lost, lost_to] and gap["unfit_batches"] == 1
    rule = next(r for r in doc["rules"] if r["rule"] == "state-replays")
    assert (rule["count"], rule["root_causes"]) == (1, 0)
    assert doc["end_state"]["offset"] == end
    assert f"a gap at offsets {lost}..{lost_to}" in doc["end_state"]["approximate"]
    at = json.loads((tmp_path / "out" / "state.json").read_text())
    assert [t["name"] for t in at["topics"]] == ["a", "b", "d", "e", "f"]  # d..f: after it
    assert at["approximate"] == doc["end_state"]["approximate"]
    assert "STATE   the end state is approximate" in text
    assert "Not exact: approximate after a gap" in (tmp_path / "out" / "report.html").read_text()


@pytest.fixture(scope="module")
def clean(spark, tmp_path_factory):
    """A clean sample log audited once: its directory, output and findings."""
    root = tmp_path_factory.mktemp("clean")
    log, out = root / "log", root / "out"
    tamper.sample(log, ())
    result, doc, text = _audit(spark, log, out)
    assert result.exit_code == 0, text
    return log, out, doc


def test_a_gap_leads_and_safety_errors_after_it_are_its_consequences(spark, clean, tmp_path):
    """The audited log lost a middle segment: the gap is the root cause and the safety
    findings after it are counted under it; the head the earlier audit verified no longer
    matches; a clean controller's copy is compared."""
    import shutil

    log0, out0, doc0 = clean
    assert doc0["verified_head"]["offset"] == 22
    assert doc0["end_state"]["offline_count"] == 0 and doc0["controller_changes"]
    log, out = tamper.copy(log0, tmp_path / "log"), tmp_path / "out"
    shutil.copytree(out0, out)
    # the earlier findings named the original directory: name this copy instead
    (out / "findings.json").write_text(json.dumps({**doc0, "log_dir": str(log)}))
    segs = list_segments(log)
    gone = int(segs[1].name[:20])
    segs[1].unlink()
    cut = tamper.cut_at_boundary(segs[-1], 1)  # and the newest batches cut off cleanly
    result, doc, text = _audit(spark, log, out, witnesses=[log0])
    assert result.exit_code == 1, text
    (gap,) = _causes(doc, "offsets-contiguous")
    assert (gap["file"], gap["position"], gap["offset"]) == (segs[2].name, 0, gone)
    assert doc["root_causes"][0]["severity"] == "error"
    rules = {r["rule"]: r for r in doc["rules"]}
    after = sum(n for n in gap["consequences"].values())
    assert after == sum(r["consequences"] for r in rules.values()) and after > 0
    assert all(r["root_causes"] == 0 for r in rules.values() if r["rule"] in gap["consequences"])
    # the cut at a batch boundary: invisible in the log alone, caught by the head the
    # earlier audit verified and by the witness
    (changed,) = _causes(doc, "history-unchanged")
    assert changed["offset"] == 22 and "truncated" in changed["detail"]
    (short,) = _causes(doc, "witness-agrees")
    assert (short["offset"], short["severity"]) == (cut, "error")
    assert doc["verified_head"] == doc0["verified_head"]  # the verified head is kept
    assert doc["witnesses"][0]["head"]["offset"] == 22
    assert "ROOT    offsets-contiguous" in text


def test_the_report_is_the_same_in_any_local_time_zone(clean):
    from tools.audit import report
    from tools.audit.run import AuditOptions, _Replayed, _report_data

    log, out, doc = clean
    meta = {
        "records": doc["records"],
        "batches": doc["batches"],
        "first_offset": doc["first_offset"],
        "last_offset": doc["last_offset"],
        "first_ms": doc["first_timestamp_ms"],
        "last_ms": doc["last_timestamp_ms"],
    }

    def render(tz: str) -> str:
        old = os.environ.get("TZ")
        os.environ["TZ"] = tz
        time.tzset()
        try:
            data = _report_data(
                out / "carry" / "volume",
                out / "carry" / "partitions",
                out / "tables",
                meta,
                doc,
                _Replayed(doc["snapshots"], None, None),
                AuditOptions(log, out),
                out,
                1.0,
            )
        finally:
            if old is None:
                os.environ.pop("TZ", None)
            else:
                os.environ["TZ"] = old
            time.tzset()
        data["meta"]["generated"] = "fixed"
        return report.render(data)

    utc, new_york = render("UTC"), render("America/New_York")
    assert utc == new_york
    assert "time (UTC)" in utc and "from (UTC)" in utc
