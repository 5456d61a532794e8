"""MetadataLog: append, roll, read, reopen, retention, concurrency, verification helpers."""

from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kraft.log import (
    MetadataLog,
    OffsetOutOfRangeError,
    parse_segment_name,
    scan_segment,
    segment_name,
    verify_log,
    verify_segment,
)
from kraft.records import (
    ZERO_HASH,
    Batch,
    Provenance,
    TopicRecord,
    batch_hash,
    decode_batch,
)


def make_batches(sizes, start=0, prev=ZERO_HASH, term=1, fmt=1):
    """Chained batches with ``sizes[i]`` records each, plus their encodings (format 1, with a
    Raft index, as logs written before controller v2 hold them, unless ``fmt=2``)."""
    out, offset = [], start
    for i, n in enumerate(sizes):
        recs = tuple(TopicRecord(f"topic-{offset + j}", f"id-{offset + j}") for j in range(n))
        raft_index = 100 + offset if fmt == 1 else 0
        b = Batch(
            offset, term, raft_index, 1_000 + offset, Provenance(reason="test"), prev, recs, 0, fmt
        )
        enc = b.encode()
        out.append((b, enc))
        prev, offset = batch_hash(enc), offset + n
    return out


def fill(mlog, sizes, term=1):
    batches = make_batches(sizes, mlog.next_offset, mlog.last_hash, term)
    for b, enc in batches:
        mlog.append_encoded(enc, b)
    return batches


def test_empty_log(tmp_path):
    with MetadataLog.open(tmp_path / "log") as mlog:
        assert (mlog.start_offset, mlog.next_offset, mlog.last_hash) == (0, 0, ZERO_HASH)
        assert mlog.size_bytes == 0 and mlog.segments == []
        assert list(mlog.read_batches(0)) == [] and mlog.read_encoded(0, 100) == []


def test_append_read_round_trip(tmp_path):
    with MetadataLog.open(tmp_path, fsync="never") as mlog:
        batches = fill(mlog, [1, 3, 2])
        mlog.sync()
        assert mlog.next_offset == 6
        last, enc = batches[-1]
        assert mlog.last_hash == batch_hash(enc)
        assert (mlog.last_term, mlog.last_raft_index, mlog.last_timestamp_ms) == (1, 104, 1004)
        assert list(mlog.read_batches(0)) == [b for b, _ in batches]
        assert mlog.read_encoded(0, 1 << 20) == [e for _, e in batches]
        assert mlog.size_bytes == sum(len(e) + 8 for _, e in batches)


def test_append_batch_encodes(tmp_path):
    with MetadataLog.open(tmp_path) as mlog:
        ((b, enc),) = make_batches([2])
        mlog.append(b)
        assert mlog.read_encoded(0, 10) == [enc]


def test_append_encoded_does_not_reencode(tmp_path, monkeypatch):
    batches = make_batches([1, 1])
    monkeypatch.setattr(Batch, "encode", lambda self: pytest.fail("re-encoded"))
    with MetadataLog.open(tmp_path) as mlog:
        for b, enc in batches:
            mlog.append_encoded(enc, b)
        assert mlog.next_offset == 2


def test_append_refuses_batches_that_do_not_follow(tmp_path):
    with MetadataLog.open(tmp_path) as mlog:
        fill(mlog, [2], term=5)
        ((b, enc),) = make_batches([1], start=3, prev=mlog.last_hash, term=5)
        with pytest.raises(ValueError, match="offset"):
            mlog.append_encoded(enc, b)
        ((b, enc),) = make_batches([1], start=2, prev=b"\x01" * 32, term=5)
        with pytest.raises(ValueError, match="prev_hash"):
            mlog.append_encoded(enc, b)
        ((b, enc),) = make_batches([1], start=2, prev=mlog.last_hash, term=4)
        with pytest.raises(ValueError, match="term"):
            mlog.append_encoded(enc, b)
        empty = Batch(2, 5, 1, 1, Provenance(), mlog.last_hash, ())
        with pytest.raises(ValueError, match="empty"):
            mlog.append(empty)
        assert mlog.next_offset == 2


def test_bad_options(tmp_path):
    with pytest.raises(ValueError):
        MetadataLog.open(tmp_path, fsync="sometimes")
    with pytest.raises(ValueError):
        MetadataLog.open(tmp_path, segment_bytes=0)


def test_roll_by_size(tmp_path):
    with MetadataLog.open(tmp_path, segment_bytes=500) as mlog:
        batches = fill(mlog, [3] * 30)
        paths = mlog.segments
        assert len(paths) > 3
        for p in paths:
            assert p.stat().st_size > 0
            first = decode_batch(p.read_bytes()[8 : 8 + int.from_bytes(p.read_bytes()[:4], "big")])
            assert parse_segment_name(p) == first.base_offset
            assert p.name == segment_name(first.base_offset)
        for p in paths[:-1]:
            assert p.stat().st_size >= 500
        assert list(mlog.read_batches(0)) == [b for b, _ in batches]


@pytest.mark.parametrize("segment_bytes", [300, 1 << 20])
def test_read_from_any_offset(tmp_path, segment_bytes):
    with MetadataLog.open(tmp_path, segment_bytes=segment_bytes) as mlog:
        batches = fill(mlog, [1, 4, 2, 1, 3] * 40)
        all_batches = [b for b, _ in batches]
        for offset in range(mlog.next_offset):
            got = list(mlog.read_batches(offset))
            assert got[0].base_offset <= offset <= got[0].last_offset
            assert got == all_batches[all_batches.index(got[0]) :]
        assert list(mlog.read_batches(mlog.next_offset)) == []
        assert list(mlog.read_batches(mlog.next_offset + 10)) == []
        assert mlog.read_encoded(mlog.next_offset, 100) == []
        last = mlog.read_encoded(mlog.next_offset - 1, 100)
        assert last == [batches[-1][1]]


def test_read_encoded_max_bytes(tmp_path):
    with MetadataLog.open(tmp_path, segment_bytes=400) as mlog:
        batches = fill(mlog, [2] * 50)
        size = len(batches[0][1])
        assert len(mlog.read_encoded(0, 1)) == 1  # at least one batch
        got = mlog.read_encoded(0, size * 5 + 1)
        assert len(got) == 5 and sum(map(len, got)) <= size * 5 + 1
        got = mlog.read_encoded(10, 1 << 20)  # crosses segments
        assert got == [e for _, e in batches[5:]]


def test_tail_cache_answers_like_the_files(tmp_path, monkeypatch):
    """read_encoded serves recent batches from memory; every answer equals the one read from
    the segment files by a fresh handle (empty cache), including offsets before the cache,
    mid-batch offsets, byte limits, and after retention or a reset."""
    import kraft.log.metadata_log as metadata_log

    monkeypatch.setattr(metadata_log, "TAIL_CACHE_BYTES", 2000)
    with MetadataLog.open(tmp_path, segment_bytes=700) as mlog:
        batches = fill(mlog, [2, 1, 3] * 30)
        size = len(batches[-1][1])
        assert 0 < len(mlog._tail_payloads) < len(batches)  # bounded: the oldest were dropped
        with MetadataLog.open(tmp_path, segment_bytes=700) as fresh:
            assert fresh._tail_payloads == []
            for offset in range(0, mlog.next_offset + 1, 7):
                for limit in (1, size * 3 + 1, 1 << 20):
                    assert mlog.read_encoded(offset, limit) == fresh.read_encoded(offset, limit)
        mlog.truncate_before(mlog.next_offset - 5)
        with pytest.raises(OffsetOutOfRangeError):
            mlog.read_encoded(0, 100)
        assert mlog.read_encoded(mlog.next_offset - 1, 100) == [batches[-1][1]]
        mlog.reset(500, ZERO_HASH)
        assert mlog.read_encoded(500, 100) == []
        more = fill(mlog, [1, 2])
        assert mlog.read_encoded(500, 1 << 20) == [e for _, e in more]


def test_reopen_continues(tmp_path):
    with MetadataLog.open(tmp_path, segment_bytes=600) as mlog:
        batches = fill(mlog, [2, 1, 3] * 10)
        state = (
            mlog.next_offset,
            mlog.last_hash,
            mlog.last_term,
            mlog.last_raft_index,
            mlog.last_timestamp_ms,
            mlog.segments,
            mlog.size_bytes,
        )
    with MetadataLog.open(tmp_path, segment_bytes=600) as mlog:
        assert (
            mlog.next_offset,
            mlog.last_hash,
            mlog.last_term,
            mlog.last_raft_index,
            mlog.last_timestamp_ms,
            mlog.segments,
            mlog.size_bytes,
        ) == state
        more = fill(mlog, [1, 1])
        assert list(mlog.read_batches(0)) == [b for b, _ in batches + more]
    assert verify_log(tmp_path) == []


def test_closed_log_refuses(tmp_path):
    mlog = MetadataLog.open(tmp_path)
    mlog.close()
    mlog.close()
    ((b, enc),) = make_batches([1])
    with pytest.raises(ValueError):
        mlog.append_encoded(enc, b)
    with pytest.raises(ValueError):
        mlog.read_encoded(0, 10)


def test_truncate_before_and_anchor(tmp_path):
    with MetadataLog.open(tmp_path, segment_bytes=300) as mlog:
        batches = fill(mlog, [1] * 40)
        segs = mlog.segments
        assert mlog.truncate_before(0) == []
        second_base = parse_segment_name(segs[2])
        deleted = mlog.truncate_before(second_base)
        assert deleted == segs[:2]
        assert mlog.start_offset == second_base
        with pytest.raises(OffsetOutOfRangeError):
            mlog.read_encoded(0, 10)
        assert [b.base_offset for b in mlog.read_batches(second_base)] == list(
            range(second_base, 40)
        )
        mlog.truncate_before(10**9)  # never deletes the last segment
        assert len(mlog.segments) == 1 and mlog.next_offset == 40
        start = mlog.start_offset
    with MetadataLog.open(tmp_path, segment_bytes=300) as mlog:  # first prev_hash is the anchor
        assert (mlog.start_offset, mlog.next_offset) == (start, 40)
        assert mlog.last_hash == batch_hash(batches[-1][1])
        fill(mlog, [1])
    assert verify_log(tmp_path) == []


def test_reset_continues_after_snapshot_point(tmp_path):
    with MetadataLog.open(tmp_path) as mlog:
        fill(mlog, [3])
        anchor = b"\x07" * 32
        mlog.reset(1000, anchor, last_term=4, last_raft_index=77, last_timestamp_ms=5)
        assert (mlog.start_offset, mlog.next_offset, mlog.last_hash) == (1000, 1000, anchor)
        assert mlog.segments == [] and list(mlog.read_batches(1000)) == []
        fill(mlog, [2], term=4)
        assert mlog.segments == [tmp_path / segment_name(1000)]
    with MetadataLog.open(tmp_path) as mlog:
        assert (mlog.start_offset, mlog.next_offset) == (1000, 1002)


def test_concurrent_reader_and_writer(tmp_path):
    batches = make_batches([1, 2, 3] * 200)
    total = batches[-1][0].next_offset
    errors: list[BaseException] = []
    with MetadataLog.open(tmp_path, segment_bytes=2000, fsync="never") as mlog:

        def reader():
            try:
                offset, prev = 0, ZERO_HASH
                while offset < total:
                    for enc in mlog.read_encoded(offset, 700):
                        b = decode_batch(enc)
                        assert b.base_offset == offset and b.prev_hash == prev
                        offset, prev = b.next_offset, batch_hash(enc)
            except BaseException as e:  # surfaced in the main thread
                errors.append(e)

        threads = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        for b, enc in batches:
            mlog.append_encoded(enc, b)
        for t in threads:
            t.join(timeout=60)
        assert not errors and not any(t.is_alive() for t in threads)


def test_scan_and_verify_clean_segments(tmp_path):
    with MetadataLog.open(tmp_path, segment_bytes=300) as mlog:
        batches = fill(mlog, [2] * 20)
        segs = mlog.segments
    assert verify_log(tmp_path) == []
    for p in segs:
        assert verify_segment(p) == []
    entries = [e for p in segs for e in scan_segment(p)]
    assert [e.batch for e in entries] == [b for b, _ in batches]
    assert entries[0].position == 0 and entries[1].position == len(batches[0][1]) + 8


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rounds=st.lists(st.lists(st.integers(1, 5), min_size=0, max_size=12), min_size=1, max_size=4),
    segment_bytes=st.integers(150, 3000),
    probe=st.integers(0, 200),
)
def test_property_append_reopen_read(tmp_path_factory, rounds, segment_bytes, probe):
    d = tmp_path_factory.mktemp("prop")
    expected: list[Batch] = []
    for sizes in rounds:
        with MetadataLog.open(d, segment_bytes=segment_bytes, fsync="never") as mlog:
            assert mlog.next_offset == (expected[-1].next_offset if expected else 0)
            expected += [b for b, _ in fill(mlog, sizes)]
    with MetadataLog.open(d, segment_bytes=segment_bytes, fsync="never") as mlog:
        assert list(mlog.read_batches(0)) == expected
        end = mlog.next_offset
        if end:
            offset = probe % end
            got = list(mlog.read_batches(offset))
            assert got and got[0].base_offset <= offset <= got[0].last_offset
            assert got[-1] == expected[-1]
            enc = mlog.read_encoded(offset, segment_bytes)
            assert [decode_batch(e) for e in enc] == got[: len(enc)]
        assert list(mlog.read_batches(end)) == []
        for p in mlog.segments:
            assert verify_segment(p) == []


def test_append_many_writes_the_same_files_as_one_by_one(tmp_path):
    """append_many (a Raft entry's batches in one write per segment) leaves byte-identical
    segments and state, rolls segments at the same places, and refuses a broken chain before
    writing anything."""
    batches = make_batches([3, 1, 2, 5] * 25)
    with MetadataLog.open(tmp_path / "one", segment_bytes=900) as one:
        for b, enc in batches:
            one.append_encoded(enc, b)
    with MetadataLog.open(tmp_path / "many", segment_bytes=900) as many:
        many.append_many([(enc, b, batch_hash(enc)) for b, enc in batches[:7]])
        many.append_many([(enc, b, batch_hash(enc)) for b, enc in batches[7:]])
        (b0, e0), (b1, e1) = batches[0], batches[1]
        size = many.size_bytes
        with pytest.raises(ValueError):
            many.append_many([(e0, b0, batch_hash(e0)), (e1, b1, batch_hash(e1))])  # not next
        assert many.size_bytes == size
        assert many.read_encoded(0, 1 << 30) == [e for _, e in batches]
    files = lambda d: {p.name: p.read_bytes() for p in sorted(d.iterdir())}
    assert len(files(tmp_path / "one")) > 3
    assert files(tmp_path / "one") == files(tmp_path / "many")
    assert verify_log(tmp_path / "many") == []


def test_a_log_of_format_1_batches_continued_in_format_2_reads_back_and_reopens(tmp_path):
    """Controller v2 appends format-2 batches to a log written before it: both read back."""
    old = make_batches([1, 2])
    new = make_batches([2, 1], start=3, prev=batch_hash(old[-1][1]), fmt=2)
    with MetadataLog.open(tmp_path) as mlog:
        for b, enc in old + new:
            mlog.append_encoded(enc, b)
    with MetadataLog.open(tmp_path) as mlog:
        assert mlog.next_offset == 6 and mlog.last_hash == batch_hash(new[-1][1])
        back = list(mlog.read_batches(0))
        assert back == [b for b, _ in old + new]
        assert [b.fmt for b in back] == [1, 1, 2, 2]
        assert [b.encode() for b in back] == [enc for _, enc in old + new]
