"""Frame codec: round trips, every split point, limits, garbage, fuzz."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.rpc.framing import FrameDecoder, FrameError, Packed, encode_answer, encode_frame

MESSAGES = [
    {
        "api": "CreateTopics",
        "version": 0,
        "correlation_id": 1,
        "body": {"topics": [{"name": "t", "num_partitions": 3}]},
    },
    {"correlation_id": 2, "error_code": 0, "error_message": "", "body": {"data": b"\x00\xff" * 10}},
    {1: "int keys", "nested": {"x": [1, 2, {"y": None}]}},
]


def test_round_trip() -> None:
    stream = b"".join(encode_frame(m) for m in MESSAGES)
    assert FrameDecoder().feed(stream) == MESSAGES


def test_split_at_every_byte_boundary() -> None:
    stream = b"".join(encode_frame(m) for m in MESSAGES)
    for cut in range(len(stream) + 1):
        dec = FrameDecoder()
        out = dec.feed(stream[:cut]) + dec.feed(stream[cut:])
        assert out == MESSAGES, cut
        assert dec.buffered == 0


def test_byte_by_byte() -> None:
    stream = b"".join(encode_frame(m) for m in MESSAGES)
    dec = FrameDecoder()
    out = []
    for i in range(len(stream)):
        out += dec.feed(stream[i : i + 1])
    assert out == MESSAGES


def test_oversized_length_rejected_before_payload() -> None:
    dec = FrameDecoder(max_frame_bytes=100)
    with pytest.raises(FrameError):
        dec.feed(struct.pack(">I", 101))
    with pytest.raises(FrameError):  # stays failed
        dec.feed(encode_frame({"a": 1}))
    with pytest.raises(FrameError):
        encode_frame({"a": b"x" * 200}, max_frame_bytes=100)


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # never-used msgpack byte
        msgpack.packb([1, 2, 3]),  # not a map
        msgpack.packb("text"),
        msgpack.packb({"a": 1}) + b"x",  # trailing garbage inside the frame
        b"",  # empty frame
    ],
)
def test_garbage_rejected(payload: bytes) -> None:
    with pytest.raises(FrameError):
        FrameDecoder().feed(struct.pack(">I", len(payload)) + payload)


def test_encode_rejects_non_maps() -> None:
    with pytest.raises(FrameError):
        encode_frame([1, 2])  # type: ignore[arg-type]  # deliberately wrong type
    with pytest.raises(FrameError):
        encode_frame({"x": object()})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_fuzz_random_bytes_never_hang_or_crash(chunks: list[bytes]) -> None:
    dec = FrameDecoder(max_frame_bytes=1024)
    for chunk in chunks:
        try:
            for frame in dec.feed(chunk):
                assert isinstance(frame, dict)
        except FrameError:
            return


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=8),
        st.one_of(
            st.integers(-(2**63), 2**63 - 1), st.text(), st.binary(), st.none(), st.booleans()
        ),
        max_size=6,
    ),
    st.integers(min_value=1, max_value=7),
)
def test_fuzz_round_trip_any_chunking(obj: dict, step: int) -> None:
    stream = encode_frame(obj) * 2
    dec = FrameDecoder()
    out = []
    for i in range(0, len(stream), step):
        out += dec.feed(stream[i : i + step])
    assert out == [obj, obj]


@pytest.mark.parametrize("correlation_id", [0, 7, 2**31 - 1])
def test_an_answer_with_a_packed_body_is_the_same_frame(correlation_id: int) -> None:
    """A body encoded once (Packed) and sent in many answers makes byte for byte the frame of
    the same body packed with each answer."""
    body = {"batches": [b"\x00" * 300, b"\xff\x01"], "high_watermark": 12, "snapshot": None}
    expected = encode_frame(
        {"correlation_id": correlation_id, "error_code": 0, "error_message": "", "body": body}
    )
    packed = Packed(msgpack.packb(body, use_bin_type=True))
    assert encode_answer(correlation_id, packed) == expected
    assert encode_answer(correlation_id, body) == expected
    decoder = FrameDecoder()
    assert decoder.feed(expected) == [
        {"correlation_id": correlation_id, "error_code": 0, "error_message": "", "body": body}
    ]
