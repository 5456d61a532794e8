"""``kraft log dump`` on synthetic logs written by the real state machine: every record once with
its provenance, CRC and hash-chain breaks reported with file, byte position and offset, snapshots.
(The real-cluster checks are in test_log_tools_cluster.py.)"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from kraft.log.segment import encode_frame, list_segments
from kraft.records import Batch, batch_hash, record_to_json
from kraft.snapshotter import image_to_snapshot
from testsupport.sample_log import write_history
from tools.cli import main


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write_history(tmp_path_factory.mktemp("log") / "log", segment_bytes=1500)


def dump(capsys, *args: str) -> tuple[int, list[dict]]:
    code = main(["log", "dump", *args, "--json"])
    out = capsys.readouterr().out
    return code, [json.loads(line) for line in out.splitlines()]


def copy_log(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for seg in list_segments(src):
        (dst / seg.name).write_bytes(seg.read_bytes())
    return dst


def records_of(items: list[dict]) -> list[dict]:
    return [i for i in items if i["kind"] == "record"]


def test_every_record_once_with_provenance_across_segments(written, capsys):
    assert len(list_segments(written.directory)) > 2
    code, items = dump(capsys, str(written.directory))
    assert code == 0
    recs = records_of(items)
    expected = [(b, i, r) for b in written.batches for i, r in enumerate(b.records)]
    assert [r["offset"] for r in recs] == list(range(len(expected)))
    for item, (batch, i, record) in zip(recs, expected):
        assert item["record"] == record_to_json(record)
        assert item["batch_offset"] == batch.base_offset and item["term"] == batch.term
        assert item["timestamp_ms"] == batch.timestamp_ms and item["time"].endswith("Z")
        assert item["provenance"] == batch.provenance.to_dict()
        assert not item["damaged"] and Path(item["file"]).parent == written.directory
    summary = items[-1]
    assert summary["kind"] == "summary" and summary["problems"] == 0
    assert summary["records"] == len(expected) and summary["last_offset"] == len(expected) - 1
    fence = next(r for r in recs if r["provenance"]["api"] == "FenceBroker")
    assert fence["provenance"]["reason"] == "session-timeout"


def test_text_lines_and_from_offset(written, capsys):
    start = written.offset("configured")
    assert main(["log", "dump", str(written.directory), "--from-offset", str(start)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"offset {start} term ")
    assert any(
        "User:bob/ops-tool IncrementalAlterConfigs (user-request): ConfigRecord" in line
        and "value=5000" in line
        for line in lines
    )
    assert lines[-1].endswith("all CRCs and the hash chain verified")
    assert len(lines) == written.offset("deleted") - start + 2


def test_flipped_byte_reported_with_file_position_and_offset(written, tmp_path, capsys):
    log = copy_log(written.directory, tmp_path / "log")
    _, items = dump(capsys, str(log))
    created = next(r for r in records_of(items) if r["provenance"]["api"] == "CreateTopics")
    seg = Path(created["file"])
    data = bytearray(seg.read_bytes())
    at = data.index(b"scratch", created["position"])
    data[at + 3] ^= 0x03  # "scratch" -> "scrbtch": still decodes, but the CRC no longer matches
    (log / seg.name).write_bytes(bytes(data))

    code, items = dump(capsys, str(log), "--from-offset", str(written.offset("fenced")))
    assert code == 1
    (problem,) = [i for i in items if i["kind"] == "problem"]
    assert problem["problem"] == "crc" and Path(problem["file"]).name == seg.name
    assert problem["position"] == created["position"]
    assert problem["offset"] == created["batch_offset"]
    assert (
        f"{seg.name} byte {created['position']} (offset {created['batch_offset']})"
        in problem["message"]
    )
    assert records_of(items)[-1]["offset"] == written.offset("deleted")  # continued past it
    assert items[-1]["problems"] == 1

    assert main(["log", "dump", str(log)]) == 1
    text = capsys.readouterr().out
    assert f"PROBLEM: CRC mismatch at {seg.name} byte {created['position']}" in text
    assert "DAMAGED: TopicRecord name=scrbtch" in text  # still decodes: shown, marked


def test_broken_hash_chain_reported(written, tmp_path, capsys):
    log = copy_log(written.directory, tmp_path / "log")
    victim = written.batches[5]
    _, items = dump(capsys, str(log))
    at = next(r for r in records_of(items) if r["offset"] == victim.base_offset)
    seg = Path(at["file"])
    data = seg.read_bytes()
    (length,) = struct.unpack_from(">I", data, at["position"])
    forged = Batch(
        victim.base_offset,
        victim.term,
        victim.raft_index,
        victim.timestamp_ms,
        victim.provenance,
        batch_hash(b"not the previous batch"),
        victim.records,
        victim.raft_position,
    )
    frame = encode_frame(forged.encode())  # valid CRC, wrong prev_hash
    end = at["position"] + 8 + length
    (log / seg.name).write_bytes(data[: at["position"]] + frame + data[end:])

    code, items = dump(capsys, str(log))
    assert code == 1
    problems = [(p["problem"], p["offset"], p["position"]) for p in items if p["kind"] == "problem"]
    after = next(r for r in records_of(items) if r["offset"] == victim.next_offset)
    # the forged batch, and the one after it (it chains from the original bytes)
    assert problems == [
        ("chain", victim.base_offset, at["position"]),
        ("chain", victim.next_offset, after["position"]),
    ]
    assert len(records_of(items)) == written.offset("deleted") + 1


def test_snapshot_dump_and_corrupt_snapshot(written, tmp_path, capsys):
    image = written.images["fenced"]
    log = copy_log(written.directory, tmp_path / "log")
    path = image_to_snapshot(log, image)
    code, items = dump(capsys, str(log))  # a directory's dump names its snapshots
    assert code == 0 and items[-1]["snapshots"] == [path.name]
    code, items = dump(capsys, str(path))
    assert code == 0
    header = items[0]
    assert header["kind"] == "snapshot" and header["end_offset"] == image.offset + 1
    assert header["image_checksum"] == image.checksum()
    recs = [i for i in items if i["kind"] == "snapshot_record"]
    assert [r["record"] for r in recs] == [record_to_json(r) for r in image.to_records()]

    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    code, items = dump(capsys, str(path))
    assert code == 1
    assert items[0]["kind"] == "problem" and items[0]["file"] == str(path)


def test_not_a_log_is_a_usage_error(tmp_path, capsys):
    assert main(["log", "dump", str(tmp_path)]) == 2
    assert "holds no metadata log segments" in capsys.readouterr().err
    assert main(["log", "dump", str(tmp_path / "missing")]) == 2
