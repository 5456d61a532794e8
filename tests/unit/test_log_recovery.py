"""MetadataLog recovery: torn tails are truncated with a warning, anything else is refused."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from kraft.log import CorruptLogError, MetadataLog, encode_frame, segment_name, verify_log
from kraft.log.segment import CHAIN, CRC, DECODE, OFFSET, TERM, TORN
from kraft.records import ZERO_HASH, Batch, Provenance, TopicRecord, batch_hash

LOGGER = "kraft.log.metadata_log"


def make_batches(sizes, start=0, prev=ZERO_HASH, terms=None):
    out, offset = [], start
    for i, n in enumerate(sizes):
        recs = tuple(TopicRecord(f"topic-{offset + j}", f"id-{offset + j}") for j in range(n))
        term = terms[i] if terms else 1
        b = Batch(offset, term, 10 + i, 1_000 + i, Provenance(), prev, recs, 0, 1)  # format 1
        enc = b.encode()
        out.append((b, enc))
        prev, offset = batch_hash(enc), offset + n
    return out


def write_log(d, sizes=(1, 2, 1, 3, 1), segment_bytes=1 << 20):
    with MetadataLog.open(d, segment_bytes=segment_bytes) as mlog:
        batches = make_batches(sizes)
        for b, enc in batches:
            mlog.append_encoded(enc, b)
        return batches, mlog.segments


def frame_positions(batches):
    pos, out = 0, []
    for _, enc in batches:
        out.append(pos)
        pos += len(enc) + 8
    return out


def write_frames(path, encs):
    path.write_bytes(b"".join(encode_frame(e) for e in encs))


# ----------------------------------------------------------------------------- torn tails


def assert_recovered(d, caplog, batches_kept, path, position):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        with MetadataLog.open(d) as mlog:
            assert mlog.next_offset == batches_kept[-1][0].next_offset
            assert mlog.last_hash == batch_hash(batches_kept[-1][1])
            assert list(mlog.read_batches(0)) == [b for b, _ in batches_kept]
            # the log accepts the batch that was lost
            ((b, enc),) = make_batches([1], mlog.next_offset, mlog.last_hash)
            mlog.append_encoded(enc, b)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(path) in w and f"byte {position}" in w for w in warnings), warnings
    assert verify_log(d) == []


def test_torn_payload_truncated(tmp_path, caplog):
    batches, (seg,) = write_log(tmp_path)
    last = frame_positions(batches)[-1]
    data = seg.read_bytes()
    seg.write_bytes(data[: last + 8 + len(batches[-1][1]) // 2])  # cut the last frame in half
    assert_recovered(tmp_path, caplog, batches[:-1], seg, last)


def test_torn_header_truncated(tmp_path, caplog):
    batches, (seg,) = write_log(tmp_path)
    end = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(b"\x00\x00\x01")  # 3 bytes of a header
    assert_recovered(tmp_path, caplog, batches, seg, end)


def test_garbage_header_truncated(tmp_path, caplog):
    batches, (seg,) = write_log(tmp_path)
    end = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(b"\x7f\xff\xff\xff\xde\xad\xbe\xef")  # length runs past EOF
    assert_recovered(tmp_path, caplog, batches, seg, end)


def test_final_frame_bad_crc_at_eof_truncated(tmp_path, caplog):
    batches, (seg,) = write_log(tmp_path)
    data = bytearray(seg.read_bytes())
    data[-3] ^= 0xFF  # inside the last payload
    seg.write_bytes(bytes(data))
    assert_recovered(tmp_path, caplog, batches[:-1], seg, frame_positions(batches)[-1])


def test_torn_tail_of_last_segment_after_rolls(tmp_path, caplog):
    batches, segs = write_log(tmp_path, sizes=[1] * 30, segment_bytes=300)
    assert len(segs) > 2
    last = segs[-1]
    kept = [bc for bc in batches if bc[0].base_offset < int(last.name[:20])]
    seg_batches = batches[len(kept) :]
    data = last.read_bytes()
    cut = len(seg_batches[0][1]) + 8 + 5  # first frame whole, then 5 bytes
    last.write_bytes(data[:cut])
    assert_recovered(tmp_path, caplog, kept + seg_batches[:1], last, len(seg_batches[0][1]) + 8)


def test_segment_with_only_a_torn_frame_is_removed(tmp_path, caplog):
    batches, segs = write_log(tmp_path, sizes=[1] * 10, segment_bytes=200)
    last = segs[-1]
    base = int(last.name[:20])
    last.write_bytes(last.read_bytes()[:6])
    kept = [bc for bc in batches if bc[0].base_offset < base]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        with MetadataLog.open(tmp_path, segment_bytes=200) as mlog:
            assert mlog.next_offset == base
            assert last not in mlog.segments
            assert list(mlog.read_batches(0)) == [b for b, _ in kept]
    assert any(str(last) in r.getMessage() for r in caplog.records)


def test_empty_trailing_segment_is_fine(tmp_path):
    batches, (seg,) = write_log(tmp_path)
    end = batches[-1][0].next_offset
    (tmp_path / segment_name(end)).touch()
    with MetadataLog.open(tmp_path) as mlog:
        assert mlog.next_offset == end
        for b, enc in make_batches([2], end, mlog.last_hash):
            mlog.append_encoded(enc, b)
        assert mlog.segments == [seg] and mlog.next_offset == end + 2


# ----------------------------------------------------------------------------- refused


def assert_refused(d, path, offset, position, reason_part):
    with pytest.raises(CorruptLogError) as info:
        MetadataLog.open(d)
    err = info.value
    assert (err.path, err.offset, err.position) == (path, offset, position)
    assert (
        str(path) in str(err) and f"offset {offset}" in str(err) and f"byte {position}" in str(err)
    )
    assert reason_part in err.reason
    return err


def test_flipped_byte_in_early_frame_refused(tmp_path):
    batches, (seg,) = write_log(tmp_path)
    pos = frame_positions(batches)[1]
    data = bytearray(seg.read_bytes())
    data[pos + 20] ^= 0x01
    seg.write_bytes(bytes(data))
    assert_refused(tmp_path, seg, 1, pos, "CRC mismatch")
    problems = verify_log(tmp_path)
    assert [p.kind for p in problems] == [CRC]
    assert (
        str(problems[0]) == f"CRC mismatch at {seg.name} byte {pos} (offset 1): frame of "
        f"{len(batches[1][1])} bytes"
    )


def test_flipped_length_refused(tmp_path):
    batches, (seg,) = write_log(tmp_path)
    pos = frame_positions(batches)[2]
    data = bytearray(seg.read_bytes())
    data[pos + 3] ^= 0x01  # length off by one
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError) as info:
        MetadataLog.open(tmp_path)
    assert info.value.position == pos and info.value.offset == 3


def test_broken_hash_chain_refused(tmp_path):
    batches, (seg,) = write_log(tmp_path)
    encs = [e for _, e in batches]
    edited = replace(batches[1][0], records=(TopicRecord("evil", "id-x"), TopicRecord("b", "c")))
    encs[1] = edited.encode()  # valid CRC, same offsets
    write_frames(seg, encs)
    pos = sum(len(e) + 8 for e in encs[:2])
    assert_refused(tmp_path, seg, 3, pos, "prev_hash")
    assert [p.kind for p in verify_log(tmp_path)] == [CHAIN]


def test_offset_gap_refused(tmp_path):
    seg = tmp_path / segment_name(0)
    batches = make_batches([1, 1])
    ((b3, e3),) = make_batches([1], start=5, prev=batch_hash(batches[-1][1]))
    write_frames(seg, [e for _, e in batches] + [e3])
    pos = sum(len(e) + 8 for _, e in batches)
    assert_refused(tmp_path, seg, 2, pos, "expected base offset 2, found 5")
    assert [p.kind for p in verify_log(tmp_path)] == [OFFSET]


def test_term_going_backwards_refused(tmp_path):
    seg = tmp_path / segment_name(0)
    batches = make_batches([1, 1, 1], terms=[1, 3, 2])
    write_frames(seg, [e for _, e in batches])
    assert_refused(tmp_path, seg, 2, frame_positions(batches)[2], "term 2 after term 3")
    assert [p.kind for p in verify_log(tmp_path)] == [TERM]


def test_undecodable_frame_refused(tmp_path):
    batches, (seg,) = write_log(tmp_path)
    write_frames(seg, [batches[0][1], b"\x93\x01\x02\x03", batches[1][1]])
    err = assert_refused(tmp_path, seg, 1, len(batches[0][1]) + 8, "undecodable")
    assert err.path == seg
    assert [p.kind for p in verify_log(tmp_path)][0] == DECODE


def test_first_segment_must_chain_from_zero(tmp_path):
    seg = tmp_path / segment_name(0)
    batches = make_batches([1], prev=b"\x01" * 32)
    write_frames(seg, [e for _, e in batches])
    assert_refused(tmp_path, seg, 0, 0, "prev_hash")


def test_torn_tail_in_earlier_segment_refused(tmp_path):
    batches, segs = write_log(tmp_path, sizes=[1] * 20, segment_bytes=300)
    first = segs[0]
    data = first.read_bytes()
    first.write_bytes(data[:-4])
    with pytest.raises(CorruptLogError) as info:
        MetadataLog.open(tmp_path)
    assert info.value.path == first
    assert info.value.position == len(data) - (len(batches[0][1]) + 8)
    assert TORN in [p.kind for p in verify_log(tmp_path)]


def test_bad_crc_not_at_eof_in_last_segment_refused(tmp_path):
    batches, (seg,) = write_log(tmp_path)
    pos = frame_positions(batches)[-2]  # second to last frame
    data = bytearray(seg.read_bytes())
    data[pos + 12] ^= 0x40
    seg.write_bytes(bytes(data))
    assert_refused(tmp_path, seg, batches[-2][0].base_offset, pos, "CRC")


def test_missing_middle_segment_refused(tmp_path):
    batches, segs = write_log(tmp_path, sizes=[1] * 20, segment_bytes=300)
    assert len(segs) >= 3
    segs[1].unlink()
    expected = int(segs[1].name[:20])
    with pytest.raises(CorruptLogError) as info:
        MetadataLog.open(tmp_path)
    assert (info.value.path, info.value.offset, info.value.position) == (segs[2], expected, 0)
    assert [p.kind for p in verify_log(tmp_path)] == [OFFSET]


def test_verify_log_reports_every_break(tmp_path):
    batches, (seg,) = write_log(tmp_path, sizes=[1] * 8)
    positions = frame_positions(batches)
    data = bytearray(seg.read_bytes())
    for i in (1, 5):
        data[positions[i] + 15] ^= 0x10
    seg.write_bytes(bytes(data))
    problems = verify_log(tmp_path)
    assert [(p.kind, p.offset, p.position) for p in problems] == [
        (CRC, 1, positions[1]),
        (CRC, 5, positions[5]),
    ]
    assert all(p.path == seg for p in problems)
