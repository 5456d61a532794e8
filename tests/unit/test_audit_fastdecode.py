"""The columnar fast decoder gives exactly the strict decoder's rows: on a real log with every
record type, on random records of every type (any text, 64-bit integers), with offset bounds,
and on damaged logs (edited bytes, torn tail, and frames whose CRC is right but whose batch fails
strict validation or is not the codec's canonical encoding). Pure Python, no SparkSession."""

from __future__ import annotations

from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kraft.log.metadata_log import MetadataLog
from kraft.log.segment import encode_frame, iter_frames, list_segments
from kraft.records import (
    BOOL,
    ENDPOINTS,
    FEATURES,
    INT,
    INTS,
    OPT_INT,
    OPT_INTS,
    OPT_STR,
    RECORD_TYPES,
    STR,
    ZERO_HASH,
    Batch,
    FeatureLevelRecord,
    NoOpRecord,
    ProducerIdsRecord,
    Provenance,
    RecordDecodeError,
    UnregisterBrokerRecord,
    batch_hash,
    decode_batch,
)
from testsupport.sample_log import write_history
from tools.audit.columns import (
    ARROW_SCHEMA,
    COLUMNS,
    JSON_ONLY,
    RENAMES,
    decode_segment,
)
from tools.audit.fastdecode import decode_segment_fast
from tools.audit.structs import decode_batch_fast, decode_canonical


def _table(batches) -> pa.Table:
    batches = list(batches)
    for b in batches:
        assert b.schema == ARROW_SCHEMA
    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA).combine_chunks()


def _same(path: Path, **kw) -> pa.Table:
    strict = _table(decode_segment(path, **kw))
    for rows in (3, 64, 65536):  # chunk boundaries anywhere
        fast = _table(decode_segment_fast(path, rows_per_batch=rows, **kw))
        for name in strict.column_names:
            assert fast[name].equals(strict[name]), (name, rows, fast[name], strict[name])
    return strict


@pytest.fixture(scope="module")
def every_type_log(tmp_path_factory) -> Path:
    """The synthetic history (a real state machine's batches) plus the types it does not
    write, across several segments."""
    d = tmp_path_factory.mktemp("fastlog") / "log"
    write_history(d, segment_bytes=1500)
    with MetadataLog.open(d, segment_bytes=1500, fsync="never") as mlog:
        prov = Provenance("User:carol", "tool", "req-x", "Misc", "test")
        extra = (
            FeatureLevelRecord("kraft.version", 1),
            ProducerIdsRecord(101, 5, 1000),
            NoOpRecord(),
            UnregisterBrokerRecord(103, 7),
        )
        batch = Batch(
            mlog.next_offset,
            mlog.last_term,
            mlog.last_raft_index + 1,
            mlog.last_timestamp_ms + 1000,
            prov,
            mlog.last_hash,
            extra,
        )
        mlog.append(batch)
    return d


def _all_canonical(directory: Path) -> bool:
    """Every frame takes the fast path (else a comparison would only test the strict one)."""
    return all(
        decode_canonical(f.payload) is not None
        for p in list_segments(directory)
        for f in iter_frames(p.read_bytes())
    )


def test_fast_decode_equals_strict_on_a_real_log_with_every_record_type(every_type_log):
    segments = list_segments(every_type_log)
    assert len(segments) > 3
    assert _all_canonical(every_type_log)
    tables = [_same(p) for p in segments]
    seen = {t for table in tables for t in table["record_type"].to_pylist()}
    assert seen == {cls.NAME for cls in RECORD_TYPES.values()}


def test_fast_decode_equals_strict_with_offset_bounds(every_type_log):
    seg = max(list_segments(every_type_log), key=lambda p: p.stat().st_size)
    offsets = _same(seg)["offset"].to_pylist()
    lo, hi = offsets[1], offsets[-2]  # inside the first and last batches
    bounded = _same(seg, from_offset=lo, to_offset=hi)
    assert bounded["offset"].to_pylist() == offsets[1:-1]
    assert _same(seg, from_offset=hi + 5).num_rows == 0


def _frames(path: Path) -> list[tuple[int, int, bytes]]:
    return [(f.position, f.end, bytes(f.payload)) for f in iter_frames(path.read_bytes())]


def _rewrite(path: Path, index: int, payload: bytes) -> None:
    """Replace frame ``index`` with ``payload`` framed with a correct CRC."""
    data = path.read_bytes()
    pos, end, _ = _frames(path)[index]
    path.write_bytes(data[:pos] + encode_frame(payload) + data[end:])


def _big_segment(d: Path) -> Path:
    return max(list_segments(d), key=lambda p: len(_frames(p)))


def test_a_valid_crc_around_a_batch_that_fails_strict_validation_is_a_decode_problem(tmp_path):
    d = tmp_path / "log"
    write_history(d, segment_bytes=1 << 20)
    seg = _big_segment(d)
    frames = _frames(seg)
    doc = msgpack.unpackb(frames[3][2], raw=False)
    doc["records"][0]["broker_id" if "broker_id" in doc["records"][0] else "topic_id"] = 1.5
    _rewrite(seg, 3, msgpack.packb(doc, use_bin_type=True))
    table = _same(seg)
    bad = table.filter(pa.compute.equal(table["position"], frames[3][0])).to_pylist()
    assert len(bad) == 1 and bad[0]["record_type"] is None and bad[0]["crc_ok"]
    assert bad[0]["problem"].startswith("decode: ") and "expected" in bad[0]["problem"]
    assert bad[0]["offset"] == msgpack.unpackb(frames[3][2])["base_offset"]  # where it was due
    good = table.filter(pa.compute.is_valid(table["record_type"]))
    assert good.num_rows > 0 and all(good["crc_ok"].to_pylist())


_ANY_INT = st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)  # what msgpack holds
_INT32 = st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1)
_INT64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
_TEXT = st.text(max_size=12)


def _ints_for(cls, name: str):
    """The widest integers the field's column holds (any 64-bit one if it is JSON only)."""
    if name in JSON_ONLY:
        return _ANY_INT
    typ = dict((n, t) for n, t, _ in COLUMNS)[RENAMES.get(cls.NAME, {}).get(name, name)]
    return _INT64 if typ == pa.int64() else _INT32


def _values(cls, name: str, kind):
    ints = _ints_for(cls, name)
    return {
        INT: ints,
        STR: _TEXT,
        BOOL: st.booleans(),
        OPT_STR: st.none() | _TEXT,
        OPT_INT: st.none() | ints,
        INTS: st.lists(ints, max_size=4).map(tuple),
        OPT_INTS: st.none() | st.lists(ints, max_size=4).map(tuple),
        ENDPOINTS: st.lists(
            st.fixed_dictionaries(
                {"name": _TEXT, "host": _TEXT, "port": _ANY_INT, "security_protocol": _TEXT}
            ),
            max_size=2,
        ).map(tuple),
        FEATURES: st.lists(
            st.fixed_dictionaries(
                {"name": _TEXT, "min_version": _ANY_INT, "max_version": _ANY_INT}
            ),
            max_size=2,
        ).map(tuple),
    }[kind]


_RECORD = st.one_of(
    [
        st.tuples(*[_values(cls, n, k) for n, k in cls.FIELDS]).map(lambda v, c=cls: c(*v))
        for cls in RECORD_TYPES.values()
    ]
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(st.lists(_RECORD, min_size=1, max_size=6), min_size=1, max_size=6),
    who=st.tuples(_TEXT, _TEXT, _TEXT, _TEXT, _TEXT),
    rows=st.sampled_from([1, 4, 1000]),
)
def test_fast_decode_equals_strict_on_random_records_of_every_type(
    tmp_path_factory, batches, who, rows
):
    """Any text (quotes, control characters, non-ASCII) and any 64-bit integer: the fast path
    takes every frame and its rows, JSON included, are the strict path's."""
    d = tmp_path_factory.mktemp("random")
    prev, offset = ZERO_HASH, 0
    with open(d / "00000000000000000000.log", "wb") as f:
        for i, records in enumerate(batches):
            encoded = Batch(
                offset, 1, i + 1, 1_790_000_000_000 + i, Provenance(*who), prev, tuple(records)
            ).encode()
            f.write(encode_frame(encoded))
            prev, offset = batch_hash(encoded), offset + len(records)
    assert _all_canonical(d)
    seg = list_segments(d)[0]
    strict = _table(decode_segment(seg))
    fast = _table(decode_segment_fast(seg, rows_per_batch=rows))
    assert fast.equals(strict)
    assert strict.num_rows == offset and strict["problem"].null_count == offset


def _widen_int(payload: bytes, key: str) -> bytes:
    """``payload`` with the positive fixint after ``key`` written as an int8: the same value
    to msgpack, but not the codec's (shortest) encoding."""
    packed = msgpack.packb(key)
    i = payload.index(packed) + len(packed)
    assert payload[i] < 0x80
    return payload[:i] + b"\xd0" + payload[i:]


def _duplicate_first_key(payload: bytes) -> bytes:
    """``payload`` whose first record map carries its ``version`` key twice."""
    i = payload.index(msgpack.packb("records")) + len(msgpack.packb("records"))
    j = i + (1 if payload[i] & 0xF0 == 0x90 else 3)  # past the array header
    assert payload[j] & 0xF0 == 0x80  # a fixmap: its size is in the low bits
    version = msgpack.packb("version")
    k = payload.index(version, j) + len(version) + 1
    return (
        payload[:j] + bytes([payload[j] + 1]) + payload[j + 1 : k] + version + b"\x00" + payload[k:]
    )


@pytest.mark.parametrize(
    "edit",
    [
        "unknown-type",
        "bool-version",
        "extra-field",
        "key-order",
        "not-msgpack",
        "bool-int",
        "wide-int",
        "duplicate-key",
        "short-hash",
    ],
)
def test_frames_the_fast_path_cannot_vouch_for_give_the_strict_rows(tmp_path, edit):
    d = tmp_path / "log"
    write_history(d, segment_bytes=1 << 20)
    seg = _big_segment(d)
    frames = _frames(seg)
    doc = msgpack.unpackb(frames[-2][2], raw=False)
    rec = doc["records"][0]
    if edit == "unknown-type":
        rec["type"] = 77
    elif edit == "bool-version":
        rec["version"] = False  # == 0 to Python: strict accepts it, JSON must still say 0
    elif edit == "extra-field":
        rec["colour"] = "red"
    elif edit == "key-order":  # strict accepts any order; JSON keeps the codec's order
        doc["records"][0] = dict(reversed(list(rec.items())))
    elif edit == "bool-int":
        key = next(k for k, v in rec.items() if type(v) is int and k not in ("type", "version"))
        rec[key] = True
    elif edit == "short-hash":  # the codec refuses a prev_hash of other than 32 bytes
        doc["prev_hash"] = doc["prev_hash"][:31]
    payload = b"\xc1junk" if edit == "not-msgpack" else msgpack.packb(doc, use_bin_type=True)
    if edit == "wide-int":
        payload = _widen_int(frames[-2][2], "base_offset")
    elif edit == "duplicate-key":
        payload = _duplicate_first_key(frames[-2][2])
    assert decode_canonical(payload) is None
    _rewrite(seg, len(frames) - 2, payload)
    table = _same(seg)
    rows = table.filter(pa.compute.equal(table["position"], frames[-2][0])).to_pylist()
    if edit in ("bool-version", "key-order", "wide-int", "duplicate-key"):
        assert rows and all(r["problem"] is None for r in rows)
    else:
        assert len(rows) == 1 and rows[0]["problem"].startswith("decode: ")


def test_edited_bytes_and_a_torn_tail_give_the_strict_rows(tmp_path):
    d = tmp_path / "log"
    write_history(d, segment_bytes=1 << 20)
    seg = _big_segment(d)
    pos, end, payload = _frames(seg)[4]
    data = bytearray(seg.read_bytes())
    i = pos + 8 + payload.index(b"req-")
    data[i + 2] = ord("Q")  # an edit that still decodes
    pos2, _, payload2 = _frames(seg)[6]
    data[pos2 + 9] ^= 0xFF  # an edit that no longer decodes
    seg.write_bytes(bytes(data) + b"\x00\x00\x10\x00\x00")  # and a torn frame at the end
    table = _same(seg)
    problems = [r["problem"] for r in table.to_pylist() if r["problem"]]
    assert "crc" in problems and problems[-1].startswith("torn: ")
    edited = table.filter(pa.compute.equal(table["position"], pos)).to_pylist()
    assert all(not r["crc_ok"] for r in edited)
    assert edited[0]["batch_hash"] != batch_hash(payload).hex()


@pytest.mark.parametrize(
    "columns",
    [
        ["offset", "record_type"],
        ["isr", "leader", "topic_id", "principal", "batch_hash", "position"],  # not in table order
        ["record_json"],
        ["feature_level", "config_value", "problem", "crc_ok"],
    ],
)
def test_a_column_subset_is_the_whole_tables_columns(every_type_log, tmp_path, columns):
    """Only the asked-for columns are built, equal to the whole table's, also for the strict
    decoder's rows (an edited frame, a torn tail)."""
    segs = list_segments(every_type_log)
    damaged = tmp_path / segs[0].name
    data = bytearray(segs[0].read_bytes())
    pos, _, payload = _frames(segs[0])[1]
    data[pos + 8 + payload.index(b"req-") + 2] ^= 1
    damaged.write_bytes(bytes(data) + b"\x00\x00\x10\x00\x00")
    for path in (*segs, damaged):
        whole = _table(decode_segment_fast(path, rows_per_batch=5))
        batches = list(decode_segment_fast(path, rows_per_batch=5, columns=columns))
        assert all(b.schema.names == columns for b in batches)
        assert pa.Table.from_batches(batches).combine_chunks().equals(whole.select(columns))
    problems = whole["problem"].to_pylist()  # (the damaged copy's)
    assert "crc" in problems and problems[-1].startswith("torn: ")


def test_an_unknown_column_is_refused():
    with pytest.raises(ValueError, match="no such column"):
        list(decode_segment_fast(Path("/nonexistent"), columns=["offset", "ofset"]))


def _same_batch(payload: bytes) -> None:
    """decode_batch_fast gives decode_batch's batch (records of the same classes, the same
    digest) or raises its error."""
    try:
        strict = decode_batch(payload)
    except RecordDecodeError as e:
        with pytest.raises(RecordDecodeError) as fast_error:
            decode_batch_fast(payload)
        assert str(fast_error.value) == str(e)
        return
    fast = decode_batch_fast(payload)
    assert fast == strict and fast.digest == strict.digest
    assert [type(r) for r in fast.records] == [type(r) for r in strict.records]
    for f, s in zip(fast.records, strict.records):
        for name, _ in type(s).FIELDS:
            assert type(getattr(f, name)) is type(getattr(s, name)), name


@settings(max_examples=40, deadline=None)
@given(records=st.lists(_RECORD, min_size=1, max_size=6), who=st.tuples(*[_TEXT] * 5))
def test_the_replays_fast_batch_decode_is_the_strict_one(records, who):
    """Every record type, any text and 64-bit integer, and the frames the fast path refuses:
    the replay gets what the strict decoder gives."""
    encoded = Batch(
        7, 2, 3, 1_790_000_000_000, Provenance(*who), ZERO_HASH, tuple(records)
    ).encode()
    assert decode_canonical(encoded) is not None
    _same_batch(encoded)
    doc = msgpack.unpackb(encoded, raw=False)
    doc["prev_hash"] = doc["prev_hash"][:31]
    _same_batch(msgpack.packb(doc, use_bin_type=True))
    doc = msgpack.unpackb(encoded, raw=False)
    doc["records"][0] = dict(reversed(list(doc["records"][0].items())))  # not canonical: strict
    _same_batch(msgpack.packb(doc, use_bin_type=True))
    doc["records"][0]["type"] = 77
    _same_batch(msgpack.packb(doc, use_bin_type=True))


def test_the_replays_fast_batch_decode_on_a_real_log(every_type_log):
    for path in list_segments(every_type_log):
        for frame in iter_frames(path.read_bytes()):
            _same_batch(bytes(frame.payload))
