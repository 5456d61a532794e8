"""The record codec: round trips for every record type, stable bytes, strict decoding."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft import records as R

ints = st.integers(min_value=-(2**31), max_value=2**63 - 1)
text = st.text(max_size=20)
int_lists = st.lists(st.integers(min_value=-1, max_value=10_000), max_size=5).map(tuple)
endpoints = st.lists(
    st.fixed_dictionaries({"name": text, "host": text, "port": ints, "security_protocol": text}),
    max_size=2,
).map(tuple)
features = st.lists(
    st.fixed_dictionaries({"name": text, "min_version": ints, "max_version": ints}), max_size=2
).map(tuple)

_KIND_STRATEGIES = {
    R.INT: ints,
    R.STR: text,
    R.BOOL: st.booleans(),
    R.INTS: int_lists,
    R.OPT_STR: st.none() | text,
    R.OPT_INT: st.none() | ints,
    R.OPT_INTS: st.none() | int_lists,
    R.ENDPOINTS: endpoints,
    R.FEATURES: features,
}


def record_strategy(cls):
    return st.builds(cls, *[_KIND_STRATEGIES[kind] for _, kind in cls.FIELDS])


any_record = st.one_of([record_strategy(cls) for cls in R.RECORD_TYPES.values()])


@settings(max_examples=300, deadline=None)
@given(any_record)
def test_every_record_type_round_trips_to_identical_bytes(record):
    encoded = record.encode()
    decoded = R.decode_record(encoded)
    assert decoded == record
    assert decoded.encode() == encoded


@settings(max_examples=300, deadline=None)
@given(any_record)
def test_generated_to_dict_is_the_generic_one(record):
    """Record types without map fields get a generated ``to_dict``: same keys, same order,
    same values as the generic loop, so the same bytes."""
    fast, generic = record.to_dict(), R.Record.to_dict(record)
    assert list(fast.items()) == list(generic.items())
    assert msgpack.packb(fast, use_bin_type=True) == msgpack.packb(generic, use_bin_type=True)


@settings(max_examples=100, deadline=None)
@given(st.lists(any_record, min_size=1, max_size=5), ints, text)
def test_batches_round_trip_and_chain(recs, term, request_id):
    first = R.Batch(  # format 1 (written before controller v2): still decodes the same
        0, abs(term), 1, 1000, R.Provenance(request_id=request_id), R.ZERO_HASH, tuple(recs), 2, 1
    )
    second = R.Batch(  # format 2 (current): no Raft index or position
        first.next_offset,
        abs(term),
        0,
        1001,
        R.Provenance(reason="session-timeout"),
        R.batch_hash(first.encode()),
        (R.NoOpRecord(),),
    )
    for b in (first, second):
        assert R.decode_batch(b.encode()) == b
    assert second.prev_hash == R.batch_hash(R.decode_batch(first.encode()).encode())


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(type=99), "unknown record type 99"),
        (lambda d: d.update(version=7), "unsupported version 7"),
        (lambda d: d.pop("name"), "missing field"),
        (lambda d: d.update(name=5), "TopicRecord.name: expected a string"),
        (lambda d: d.update(extra=1), "unknown field"),
    ],
)
def test_strict_decoding_names_the_problem(mutate, message):
    d = R.TopicRecord("orders", "id-1").to_dict()
    mutate(d)
    with pytest.raises(R.RecordDecodeError, match=message):
        R.decode_record(msgpack.packb(d))


def test_bool_is_not_an_int_and_garbage_is_refused():
    d = R.PartitionRecord(0, "t", (1,), (1,), (), (), 1, 0, 0, 0).to_dict()
    d["leader"] = True
    with pytest.raises(R.RecordDecodeError, match="leader"):
        R.record_from_dict(d)
    with pytest.raises(R.RecordDecodeError):
        R.decode_record(b"\xc1\xff garbage")
    with pytest.raises(R.RecordDecodeError):
        R.decode_batch(msgpack.packb({"format": 1}))


def test_decoded_batch_carries_the_hash_of_its_bytes():
    import dataclasses

    batch = R.Batch(
        5,
        2,
        9,
        1234,
        R.Provenance(api="Test"),
        bytes(32),
        (R.TopicRecord("a", "id-a"), R.NoOpRecord()),
        0,
        1,
    )
    assert batch.digest is None
    encoded = batch.encode()
    decoded = R.decode_batch(encoded)
    assert decoded.digest == R.batch_hash(encoded)
    assert decoded == batch  # not part of equality
    assert dataclasses.replace(decoded, records=()).digest is None  # a changed batch re-hashes


# ---- the fast decoders accept and refuse exactly what the generic strict decoder does ---------

_BAD_VALUES = [
    True,
    False,
    0,
    -3,
    1.5,
    "x",
    b"x",
    None,
    (),
    (1, 2),
    (1, "2"),
    (True,),
    (1.0,),
    [1, 2],
    {"a": 1},
    ({"name": "x"},),
]


def _generic(d):
    try:
        return R._record_from_dict_checked(d)
    except R.RecordDecodeError:
        return "refused"


def _fast_or_generic(d):
    try:
        return R.record_from_dict(d)
    except R.RecordDecodeError:
        return "refused"


@settings(max_examples=300, deadline=None)
@given(any_record, st.data())
def test_fast_decoder_matches_the_generic_decoder(record, data):
    d = msgpack.unpackb(record.encode(), raw=False, use_list=False)  # as decode_batch reads it
    assert R._FAST_DECODERS[record.TYPE](d) == record == R.record_from_dict(d)
    names = ["type", "version", *(n for n, _ in record.FIELDS)]
    mutated = dict(d)
    for name in data.draw(st.lists(st.sampled_from(names), max_size=3)):
        mutated[name] = data.draw(st.sampled_from(_BAD_VALUES))
    if data.draw(st.booleans()):
        mutated.pop(data.draw(st.sampled_from(names)))
    if data.draw(st.booleans()):
        mutated[data.draw(st.sampled_from(["extra", 5]))] = 1
    assert _fast_or_generic(mutated) == _generic(mutated)


@pytest.mark.parametrize(
    "field, value",
    [
        ("type", True),
        ("type", 3.0),
        ("version", True),
        ("version", 0.0),
        ("leader", True),
        ("replicas", (1, True)),
        ("isr", [1, 2]),
        ("isr", (1, 2.0)),
        ("removing_replicas", None),
        ("topic_id", b"t"),
    ],
)
def test_fast_path_refuses_or_defers_like_the_generic_decoder(field, value):
    """Values the generic decoder refuses are refused; values it normalises (a list where a
    tuple is expected, version False == 0) go through it and come out the same."""
    d = msgpack.unpackb(
        R.PartitionRecord(0, "t", (1,), (1,), (), (), 1, 0, 0, 0).encode(),
        raw=False,
        use_list=False,
    )
    d[field] = value
    assert _fast_or_generic(d) == _generic(d)


def test_batch_envelope_decode_matches_and_rejects_like_the_full_decode():
    """Start-up recovery decodes only a batch's own fields; they equal the full decode's, the
    record count is right, and malformed envelopes are refused the same way."""
    recs = (R.TopicRecord("t", "id-t"),) + tuple(
        R.PartitionRecord(i, "id-t", (1, 2, 3), (1, 2), (), (), 1, 0, 0, 0) for i in range(5)
    )
    batch = R.Batch(
        7, 2, 11, 1_000, R.Provenance(reason="x"), R.ZERO_HASH, recs, raft_position=3, fmt=1
    )
    enc = batch.encode()
    env = R.decode_batch_envelope(enc)
    full = R.decode_batch(enc, check_records=False)
    assert (
        env.base_offset,
        env.term,
        env.raft_index,
        env.raft_position,
        env.timestamp_ms,
        env.provenance,
        env.prev_hash,
        env.next_offset,
        env.digest,
    ) == (
        full.base_offset,
        full.term,
        full.raft_index,
        full.raft_position,
        full.timestamp_ms,
        full.provenance,
        full.prev_hash,
        full.next_offset,
        full.digest,
    )
    d = msgpack.unpackb(enc, raw=False)
    bad = [
        enc + b"\x00",
        enc[:-1],
        b"\x93\x01\x02\x03",
        msgpack.packb({**d, "term": "2"}),
        msgpack.packb({**d, "prev_hash": b"short"}),
        msgpack.packb({k: d[k] for k in reversed(list(d))}),
        msgpack.packb({**d, "records": 5}),
        msgpack.packb({**d, "format": 99}),
    ]
    for data in bad:
        with pytest.raises(R.RecordDecodeError):
            R.decode_batch(data, check_records=False)
        with pytest.raises(R.RecordDecodeError):
            R.decode_batch_envelope(data)


def test_batch_provenance_any_key_order_decodes_and_bad_fields_are_refused():
    """The canonical provenance map (keys in order) and a reordered one decode to the same
    batch; a provenance value that is not a string, or a non-integer offset, is refused."""
    batch = R.Batch(
        5,
        2,
        9,
        1234,
        R.Provenance("User:a", "cli", "rid", "CreateTopics", "user-request"),
        bytes(32),
        (R.NoOpRecord(),),
        1,
        1,
    )
    d = msgpack.unpackb(batch.encode(), raw=False, use_list=False)
    assert R.decode_batch(batch.encode()) == batch
    d["provenance"] = dict(reversed(list(d["provenance"].items())))
    assert R.decode_batch(msgpack.packb(d, use_bin_type=True)) == batch
    for key, bad in (
        ("provenance", {**d["provenance"], "api": 7}),
        ("provenance", {"api": "x"}),
        ("term", "2"),
        ("raft_position", True),
    ):
        with pytest.raises(R.RecordDecodeError):
            R.decode_batch(msgpack.packb({**d, key: bad}, use_bin_type=True))


def test_format_2_batches_carry_no_raft_fields_and_formats_do_not_mix():
    """The active controller builds a batch before Raft places it: format 2 has no raft_index
    or raft_position (they read as 0); a format-1 key set under format 2, or the reverse, and
    an unknown format are refused."""
    batch = R.Batch(3, 4, 0, 99, R.Provenance(api="NoOp"), R.ZERO_HASH, (R.NoOpRecord(),))
    assert batch.fmt == R.BATCH_FORMAT == 2
    enc = batch.encode()
    d = msgpack.unpackb(enc, raw=False, use_list=False)
    assert list(d) == [
        "format",
        "base_offset",
        "term",
        "timestamp_ms",
        "provenance",
        "prev_hash",
        "records",
    ]
    back = R.decode_batch(enc)
    assert back == batch and back.encode() == enc and back.raft_index == back.raft_position == 0
    env = R.decode_batch_envelope(enc)
    assert (env.fmt, env.base_offset, env.next_offset, env.digest) == (2, 3, 4, R.batch_hash(enc))
    v1 = msgpack.unpackb(dataclasses.replace(batch, fmt=1).encode(), raw=False, use_list=False)
    for bad in (
        {**d, "format": 1},
        {**v1, "format": 2},
        {**d, "format": 3},
        {**d, "format": True},
    ):
        for decode in (R.decode_batch, R.decode_batch_envelope):
            with pytest.raises(R.RecordDecodeError):
                decode(msgpack.packb(bad, use_bin_type=True))
