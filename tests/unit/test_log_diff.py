"""``kraft log diff`` and the history reader on synthetic logs written by the real state machine:
points (offsets, ISO-8601, epoch ms), topics/brokers/partitions/configs with who and why, snapshot
starts, damaged logs. (The broker-kill check on a real cluster is in test_log_tools_cluster.py.)"""

from __future__ import annotations

import json

import pytest

from kraft.log.segment import list_segments
from kraft.snapshotter import image_to_snapshot
from testsupport.sample_log import write_history
from tools.cli import main
from tools.log_history import Point, diff, iso_time, parse_point
from tools.log_reader import History, LogReadError


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write_history(tmp_path_factory.mktemp("log") / "log", segment_bytes=1500)


@pytest.fixture(scope="module")
def history(written):
    return History.load(written.directory)


def test_parse_point():
    assert parse_point("42") == Point(offset=42)
    assert parse_point("-1") == Point(offset=-1)
    assert parse_point("1790000000000") == Point(timestamp_ms=1_790_000_000_000)
    assert parse_point("2026-09-21T14:13:20Z") == Point(timestamp_ms=1_790_000_000_000)
    assert parse_point("2026-09-21T14:13:20") == Point(timestamp_ms=1_790_000_000_000)  # UTC
    assert parse_point("2026-09-21T16:13:20+02:00") == Point(timestamp_ms=1_790_000_000_000)
    assert iso_time(1_790_000_000_123) == "2026-09-21T14:13:20.123Z"
    for bad in ("-2", "yesterday", "2026-13-45", ""):
        with pytest.raises(ValueError):
            parse_point(bad)


def test_history_images_match_the_state_machine(written, history):
    assert history.base.offset == -1 and len(history.batches) == len(written.batches)
    for step, image in written.images.items():
        assert history.image_at(image.offset).checksum() == image.checksum(), step
    assert history.image_at().checksum() == written.images["deleted"].checksum()
    # an offset inside a batch means the image after that whole batch
    created = written.images["created"]
    assert history.image_at(created.offset - 2).checksum() == created.checksum()


def test_fence_window_lists_fence_elections_and_isr_shrinks(written, history):
    result = diff(
        history, Point(offset=written.offset("configured")), Point(offset=written.offset("fenced"))
    )
    before = written.images["configured"]
    (fence,) = result.of_kind("broker-fenced")
    assert fence.details["broker_id"] == 101 and fence.reason == "session-timeout"
    assert (fence.principal, fence.api) == ("controller", "FenceBroker")
    parts = result.of_kind("partition-changed")
    led = {
        (t.name, pid)
        for t in before.topics_by_id.values()
        for pid, p in t.partitions.items()
        if p.leader == 101
    }
    hosted = {
        (t.name, pid)
        for t in before.topics_by_id.values()
        for pid, p in t.partitions.items()
        if 101 in p.isr
    }
    assert led and {(c.details["topic"], c.details["partition"]) for c in parts} == hosted
    for c in parts:
        key = (c.details["topic"], c.details["partition"])
        assert "isr-shrink" in c.details["changes"] and 101 in c.details["isr"][0]
        assert 101 not in c.details["isr"][1] and c.reason == "session-timeout"
        if key in led:
            assert "leader-election" in c.details["changes"] and c.details["election"] == "clean"
            assert c.details["leader"][0] == 101 and c.details["leader"][1] != 101
            assert c.details["leader_epoch"][1] == c.details["leader_epoch"][0] + 1
        else:
            assert "leader-election" not in c.details["changes"]
    summary = result.summary()
    assert summary["leader-elections"] == len(led) and summary["isr-shrinks"] == len(hosted)
    assert result.end.checksum() == written.images["fenced"].checksum()


def test_whole_history_topics_brokers_configs(written, history):
    result = diff(history, Point(offset=-1), Point(offset=history.last_offset))
    assert [c.details["topic"] for c in result.of_kind("topic-created")] == ["orders", "scratch"]
    assert result.of_kind("topic-created")[0].details["partitions"] == 3
    (deleted,) = result.of_kind("topic-deleted")
    assert deleted.details["topic"] == "scratch" and deleted.principal == "User:alice"
    assert sorted(c.details["broker_id"] for c in result.of_kind("broker-registered")) == [
        101,
        102,
        103,
    ]
    assert len(result.of_kind("broker-unfenced")) == 4
    configs = [
        (c.details["old"], c.details["new"], c.principal, c.client_id)
        for c in result.of_kind("config-changed")
    ]
    assert configs == [
        (None, "1000", "User:bob", "ops-tool"),
        ("1000", "5000", "User:bob", "ops-tool"),
    ]
    (activated,) = result.of_kind("controller-activated")
    assert activated.details["controller_id"] == 1
    assert result.records == sum(len(b.records) for b in written.batches)


def test_time_points_select_the_same_window(written, history):
    by_offset = diff(
        history, Point(offset=written.offset("configured")), Point(offset=written.offset("fenced"))
    )
    by_time = diff(
        history,
        parse_point(iso_time(written.time("configured"))),
        parse_point(str(written.time("fenced"))),
    )
    assert [c.to_json() for c in by_time.changes] == [c.to_json() for c in by_offset.changes]
    with pytest.raises(LogReadError, match="after --to"):
        diff(history, Point(offset=10), Point(offset=5))


def test_cli_text_and_json(written, capsys):
    args = [
        "log",
        "diff",
        str(written.directory),
        "--from",
        str(written.offset("configured")),
        "--to",
        str(written.offset("fenced")),
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "broker 101 fenced" in text and "by controller via FenceBroker: session-timeout" in text
    assert "clean election" in text and "ISR shrink" in text
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["from"]["offset"] == written.offset("configured")
    assert doc["to"]["offset"] == written.offset("fenced")
    assert {c["kind"] for c in doc["changes"]} == {"partition-changed", "broker-fenced"}
    assert main(["log", "diff", str(written.directory), "--from", "soon"]) == 2
    assert "neither an offset" in capsys.readouterr().err


def test_history_continues_from_a_snapshot_after_retention(written, tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    image = written.images["configured"]
    image_to_snapshot(log, image)
    kept = list_segments(written.directory)[2:]  # older segments deleted by retention
    assert 0 < int(kept[0].name[:20]) <= image.offset + 1
    for seg in kept:
        (log / seg.name).write_bytes(seg.read_bytes())
    history = History.load(log)
    assert history.base.checksum() == image.checksum()
    assert history.image_at().checksum() == written.images["deleted"].checksum()
    with pytest.raises(LogReadError, match="before the start"):
        diff(history, Point(offset=0), Point(offset=history.last_offset))
    result = diff(history, Point(offset=image.offset), Point(offset=history.last_offset))
    assert result.of_kind("broker-fenced") and result.of_kind("topic-deleted")


def test_damaged_log_is_refused_with_where(written, tmp_path, capsys):
    log = tmp_path / "log"
    log.mkdir()
    segs = list_segments(written.directory)
    for seg in segs:
        data = bytearray(seg.read_bytes())
        if seg == segs[1]:
            data[20] ^= 0xFF
        (log / seg.name).write_bytes(bytes(data))
    with pytest.raises(LogReadError, match=f"CRC mismatch at {segs[1].name} byte 0"):
        History.load(log)
    assert main(["log", "diff", str(log)]) == 1
    assert "CRC mismatch" in capsys.readouterr().err
