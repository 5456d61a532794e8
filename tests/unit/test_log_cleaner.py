"""The log cleaner: the pure plan (latest per key, tombstones, transactions, producer state) and
the segment rewrite of a real PartitionLog (offsets kept, active segment untouched, crash-safe
swap, a reload that replays to the same state)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from broker.coordinator.record_batch import encode_batch, read_entries, read_records
from broker.replica.cleaner import CleanerConfig, clean_segments, dirty_ratio, topic_settings
from broker.replica.control_batch import encode_marker
from broker.replica.log_cleaner import DROP, FILTER, KEEP, filter_batch, parse_batch, plan
from broker.replica.partition_log import (
    CLEANED_SUFFIX,
    SWAP_SUFFIX,
    PartitionLog,
    parse_batches,
)

NOW = 10_000_000
DAY = 86_400_000


def at(base: int, data: bytes) -> bytes:
    out = bytearray(data)
    struct.pack_into(">q", out, 0, base)
    return bytes(out)


def batch(base: int, *records: tuple[str, str | None], ts: int = NOW, producer=None) -> bytes:
    recs = [(k.encode(), None if v is None else v.encode()) for k, v in records]
    return at(base, encode_batch(recs, ts, producer))


def marker(base: int, pid: int, commit: bool, ts: int = NOW) -> bytes:
    return at(base, encode_marker(pid, 0, commit, 0, ts))


def decide(*raw: bytes, producers=None, first=True, retention=DAY, now=NOW):
    views = [parse_batch(b) for b in raw]
    return views, plan(views, now, retention, producers or {}, first)


def test_latest_record_per_key_survives_offsets_kept():
    raw = [batch(0, ("a", "1"), ("b", "1")), batch(2, ("a", "2")), batch(3, ("c", "1"), ("a", "3"))]
    views, p = decide(*raw)
    assert [d.action for d in p.decisions] == [FILTER, DROP, KEEP]
    assert p.decisions[0].keep_offsets == {1}  # b
    assert (p.records_removed, p.batches_removed) == (2, 1)
    out = filter_batch(raw[0], views[0], p.decisions[0].keep_offsets)
    assert list(read_records(out)) == [(1, b"b", b"1")]
    (info,), used = parse_batches(out)  # a valid batch (CRC) with its offsets and sequence range
    assert (info.base_offset, info.last_offset, used) == (0, 1, len(out))


def test_first_batch_of_the_log_stays_empty():
    raw = [batch(0, ("a", "1")), batch(1, ("a", "2"))]
    _, p = decide(*raw, first=True)
    assert [d.action for d in p.decisions] == [FILTER, KEEP]
    assert p.decisions[0].keep_offsets == frozenset()
    _, later = decide(*raw, first=False)
    assert [d.action for d in later.decisions] == [DROP, KEEP]
    views, again = decide(filter_batch(raw[0], parse_batch(raw[0]), ()), raw[1], first=False)
    assert views[0].records == () and again.decisions[0].action == DROP


def test_tombstone_kept_until_delete_retention_then_removed():
    raw = [batch(0, ("x", "1")), batch(1, ("a", "1")), batch(2, ("a", None), ts=NOW - 1000)]
    _, young = decide(*raw, retention=5000)
    assert young.decisions[2].action == KEEP
    assert young.decisions[1].action == DROP
    _, old = decide(*raw, retention=500)
    assert [d.action for d in old.decisions] == [KEEP, DROP, DROP]


def test_aborted_transaction_removed_and_hides_nothing():
    pid = 7
    raw = [
        batch(0, ("k", "committed")),
        batch(1, ("k", "aborted"), producer=(pid, 0)),
        marker(2, pid, commit=False, ts=NOW - 2 * DAY),
        batch(3, ("z", "1")),
    ]
    _, p = decide(*raw)
    assert p.decisions[0].action == KEEP  # the aborted write does not supersede it
    assert p.decisions[1].action == DROP
    assert p.decisions[2].action == DROP  # no record of its transaction left, horizon passed
    _, fresh = decide(*raw[:2], marker(2, pid, commit=False), raw[3])
    assert fresh.decisions[2].action == KEEP  # a marker stays until delete.retention.ms


def test_committed_transaction_supersedes_and_keeps_marker_while_records_remain():
    pid = 9
    raw = [
        batch(0, ("k", "old")),
        batch(1, ("k", "new"), producer=(pid, 0)),
        marker(2, pid, commit=True, ts=0),
    ]
    _, p = decide(*raw, first=False)
    assert [d.action for d in p.decisions] == [DROP, KEEP, KEEP]


def test_undecided_transaction_kept_and_hides_nothing():
    pid = 3
    raw = [batch(0, ("k", "old")), batch(1, ("k", "new"), producer=(pid, 0))]  # marker beyond range
    _, p = decide(*raw, first=False)
    assert [d.action for d in p.decisions] == [KEEP, KEEP]


def test_last_batch_of_a_live_producer_kept_empty():
    pid = 11
    raw = [
        batch(0, ("k", "1"), producer=(pid, 0)),  # transactional, committed below
        marker(1, pid, commit=True, ts=NOW - 2 * DAY),
        batch(2, ("k", "2")),
    ]
    _, p = decide(*raw, producers={pid: 0}, first=False)
    assert p.decisions[0].action == FILTER and p.decisions[0].keep_offsets == frozenset()
    assert p.decisions[1].action == KEEP  # its data batch stays: the marker must close it
    _, gone = decide(*raw, producers={}, first=False)
    assert [d.action for d in gone.decisions] == [DROP, DROP, KEEP]


def test_compressed_batches_kept_whole_and_hide_nothing():
    comp = bytearray(batch(1, ("k", "2")))
    struct.pack_into(">h", comp, 21, 1)  # gzip bit: the planner never reads its records
    _, p = decide(batch(0, ("k", "1")), bytes(comp), first=False)
    assert [d.action for d in p.decisions] == [KEEP, KEEP]


def test_settings_and_dirty_ratio():
    s = topic_settings(
        {"cleanup.policy": "compact,delete", "delete.retention.ms": "5"}, CleanerConfig()
    )
    assert s.compact and s.delete_retention_ms == 5 and s.min_cleanable_ratio == 0.5
    assert not topic_settings({}, CleanerConfig()).compact
    segs = [(Path("a"), 0, 100), (Path("b"), 10, 300)]
    assert dirty_ratio(segs, [10, 20], 10) == 0.75
    assert dirty_ratio(segs, [10, 20], 20) == 0.0


# ---- the rewrite of a real log --------------------------------------------------------------


def fill(tmp_path: Path, rounds: int = 6, keys: int = 5) -> PartitionLog:
    plog = PartitionLog.open(tmp_path / "t-0", segment_bytes=400)
    for r in range(rounds):
        for k in range(keys):
            plog.append(encode_batch([(f"k{k}".encode(), f"v{r}".encode())], NOW), 0)
    plog.set_high_watermark(plog.log_end_offset)
    return plog


def entries(plog: PartitionLog) -> list:
    out, offset = [], plog.log_start_offset
    while offset < plog.log_end_offset:
        data = plog.read(offset, 1 << 20)
        out += list(read_entries(data))
        offset = parse_batches(data)[0][-1].last_offset + 1
    return out


def latest(plog: PartitionLog) -> dict[bytes | None, bytes | None]:
    return {e.key: e.value for e in entries(plog)}


def clean(plog: PartitionLog, segment_bytes: int = 1 << 20):
    segs = plog.cleanable_segments()
    end = plog.segment_end(segs[-1][1])
    result = clean_segments(plog.dir, segs, end, segment_bytes, NOW, DAY, {}, True, fsync=False)
    return segs, end, result


def test_clean_log_keeps_latest_values_offsets_and_active_segment(tmp_path):
    plog = fill(tmp_path)
    before, active = latest(plog), plog.segment_files()[-1]
    active_bytes = active.read_bytes()
    start, end_offset = plog.log_start_offset, plog.log_end_offset
    segs, end, result = clean(plog)
    assert all(p != active for p, _, _ in segs)
    assert plog.swap_cleaned(result.groups, plog.layout_version, end)
    assert latest(plog) == before
    assert active.read_bytes() == active_bytes  # never the active segment
    assert (plog.log_start_offset, plog.log_end_offset) == (start, end_offset)
    assert len(plog.segment_files()) == 2  # small cleaned segments merged into one
    assert result.bytes_after < result.bytes_before and result.records_removed > 0
    offsets = [e.offset for e in entries(plog)]
    assert offsets == sorted(set(offsets)) and len(offsets) < end_offset  # gaps, order kept
    gap = next(o for o in range(end_offset) if o not in offsets)
    after = [e.offset for e in read_entries(plog.read(gap, 1 << 20))]
    assert after and all(o > gap for o in after)  # a read inside a gap gets the next batch
    plog.close()
    again = PartitionLog.open(tmp_path / "t-0", segment_bytes=400)
    assert latest(again) == before and again.first_dirty_offset == end
    assert again.cleanable_segments()  # nothing new since: ratio 0
    assert dirty_ratio(again.cleanable_segments(), [end], again.first_dirty_offset) == 0.0


def test_swap_refused_after_truncation(tmp_path):
    plog = fill(tmp_path)
    version = plog.layout_version
    segs, end, result = clean(plog)
    plog.truncate_to(plog.log_end_offset - 1)
    assert not plog.swap_cleaned(result.groups, version, end)
    assert not list(plog.dir.glob(f"*{CLEANED_SUFFIX}"))


@pytest.mark.parametrize("stage", ["cleaned", "swap"])
def test_crash_during_swap_recovers(tmp_path, stage):
    plog = fill(tmp_path)
    before = latest(plog)
    segs, end, result = clean(plog)
    plog.close()
    (group,) = result.groups
    if stage == "swap":  # renamed to .swap, some sources already deleted, then a crash
        group.path.rename(
            group.path.with_name(group.path.name[: -len(CLEANED_SUFFIX)] + SWAP_SUFFIX)
        )
        segs[1][0].unlink()
    reopened = PartitionLog.open(tmp_path / "t-0", segment_bytes=400)
    assert latest(reopened) == before
    names = sorted(p.name for p in reopened.dir.iterdir())
    assert not [n for n in names if n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX))]
    if stage == "swap":
        assert len(reopened.segment_files()) == 2
    else:
        assert len(reopened.segment_files()) == len(segs) + 1


def test_coordinator_state_is_the_same_after_compaction(tmp_path):
    from broker.coordinator.group.records import (
        OffsetKey,
        OffsetValue,
        decode_record,
        encode_key,
        encode_value,
    )
    from broker.coordinator.group.state_machine import GroupShard
    from broker.coordinator.runtime import LogReplayer

    plog = PartitionLog.open(tmp_path / "__consumer_offsets-0", segment_bytes=2000)
    for i in range(300):
        key = OffsetKey(f"g{i % 3}", "t", i % 4)
        rec = (encode_key(key), encode_value(OffsetValue(i, -1, "", NOW)))
        plog.append(encode_batch([rec], NOW), 0)
    plog.append(encode_batch([(encode_key(OffsetKey("g0", "t", 1)), None)], NOW), 0)
    plog.set_high_watermark(plog.log_end_offset)

    def state() -> dict:
        shard = GroupShard()
        r = LogReplayer(shard, decode_record, "t")
        for _ in r.chunks(plog, plog.log_end_offset, 512):
            pass
        return {g: dict(grp.offsets) for g, grp in shard.groups.items()}

    before = state()
    _, end, result = clean(plog)
    assert plog.swap_cleaned(result.groups, plog.layout_version, end)
    assert result.bytes_after * 5 < result.bytes_before
    assert state() == before
    assert ("t", 1) not in before["g0"]


def test_follower_replicates_a_compacted_leader_gaps_and_all(tmp_path):
    leader = fill(tmp_path)
    follower = PartitionLog.open(tmp_path / "f-0", segment_bytes=400)
    follower.append_as_follower(leader.read(0, 300))  # the first batches, before compaction
    _, end, result = clean(leader)
    assert leader.swap_cleaned(result.groups, leader.layout_version, end)
    while follower.log_end_offset < leader.log_end_offset:  # fetches land in gaps now
        follower.append_as_follower(leader.read(follower.log_end_offset, 300))
    assert latest(follower) == latest(leader)
    assert follower.log_end_offset == leader.log_end_offset


def test_a_damaged_closed_segment_is_never_rewritten(tmp_path):
    """A flipped byte in a closed segment (below the recovery point, so open did not scan it):
    the cleaner checks CRCs before it plans and refuses, so the damage is not resealed under
    a fresh CRC, and no compacted file is left behind."""
    from broker.replica.partition_log import CorruptRecordError

    plog = fill(tmp_path)
    segs = plog.cleanable_segments()
    victim = segs[0][0]
    data = bytearray(victim.read_bytes())
    data[-3] ^= 0xFF  # inside the last batch's records
    victim.write_bytes(bytes(data))
    end = plog.segment_end(segs[-1][1])
    with pytest.raises(CorruptRecordError, match=victim.name):
        clean_segments(plog.dir, segs, end, 1 << 20, NOW, DAY, {}, True, fsync=False)
    assert not list(plog.dir.glob(f"*{CLEANED_SUFFIX}"))
