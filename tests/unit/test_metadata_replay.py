"""kraft.metadata.replay: one replay for every reader of the log (snapshot + batches -> image)."""

from __future__ import annotations

import dataclasses

import pytest

from kraft.metadata.delta import MetadataDelta, ReplayError
from kraft.metadata.image import MetadataImage
from kraft.metadata.replay import image_from_records, replay, replay_into
from kraft.records import decode_batch
from testsupport.sample_log import Written, write_history


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Written:
    return write_history(tmp_path_factory.mktemp("log") / "log")


def _snapshot_of(image: MetadataImage) -> MetadataImage:
    """The image a snapshot of ``image`` loads as (its records, its provenance)."""
    return image_from_records(
        image.iter_records(),
        offset=image.offset,
        term=image.term,
        raft_index=image.raft_index,
        timestamp_ms=image.timestamp_ms,
        last_hash=image.last_hash,
    )


def test_replay_of_the_whole_log_is_the_controllers_image(sample: Written) -> None:
    image = replay(MetadataImage.EMPTY, sample.batches)
    expected = sample.images["deleted"]
    assert image.offset == expected.offset == sample.batches[-1].last_offset
    assert image.last_hash == expected.last_hash
    assert image.checksum() == expected.checksum()
    assert image.checksum(1) == expected.checksum(1)


def test_replay_matches_one_delta_per_batch(sample: Written) -> None:
    """The old loops: the controller applied one delta per batch, the tools one per run."""
    image = MetadataImage.EMPTY
    for batch in sample.batches:
        delta = MetadataDelta(image)
        delta.replay_batch(batch)
        image = delta.apply()
    assert replay(MetadataImage.EMPTY, sample.batches).checksum() == image.checksum()


@pytest.mark.parametrize("step", ["brokers", "created", "configured", "fenced", "unfenced"])
def test_snapshot_plus_tail_is_the_full_replay(sample: Written, step: str) -> None:
    full = replay(MetadataImage.EMPTY, sample.batches)
    snapshot = _snapshot_of(sample.images[step])
    # the batches a snapshot covers are skipped: the whole log can be handed over
    from_snapshot = replay(snapshot, sample.batches)
    assert from_snapshot.checksum() == full.checksum()
    assert from_snapshot.last_hash == full.last_hash
    tail = [b for b in sample.batches if b.last_offset > snapshot.offset]
    assert replay(snapshot, tail).checksum() == full.checksum()


def test_replay_uses_the_decoded_digest_or_hashes_the_batch(sample: Written) -> None:
    """A batch from a decoder carries its digest; one without (a replaced copy) is hashed."""
    log_batches = [decode_batch(b.encode()) for b in sample.batches]
    bare = [dataclasses.replace(b) for b in sample.batches]
    assert all(b.digest is not None for b in log_batches)
    assert all(b.digest is None for b in bare)
    assert replay(MetadataImage.EMPTY, log_batches) == replay(MetadataImage.EMPTY, bare)


def test_nothing_new_returns_the_snapshot_itself(sample: Written) -> None:
    image = sample.images["deleted"]
    assert replay(image, sample.batches) is image
    assert replay(image, []) is image


def test_replay_into_counts_and_keeps_the_delta_open(sample: Written) -> None:
    delta = MetadataDelta(MetadataImage.EMPTY)
    half = len(sample.batches) // 2
    assert replay_into(delta, sample.batches[:half]) == half
    assert replay_into(delta, sample.batches) == len(sample.batches) - half  # overlap skipped
    assert delta.apply().checksum() == sample.images["deleted"].checksum()


def test_a_batch_that_does_not_continue_the_log_raises(sample: Written) -> None:
    with pytest.raises(ReplayError, match="does not follow"):
        replay(MetadataImage.EMPTY, sample.batches[1:])
    broken = dataclasses.replace(sample.batches[3], prev_hash=b"\x01" * 32)
    with pytest.raises(ReplayError, match="prev_hash"):
        replay(MetadataImage.EMPTY, [*sample.batches[:3], broken])
