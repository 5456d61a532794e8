"""The broker's metadata loader writes checkpoints in the background: a slow disk must not hold
up the next fetch, so a broker learns of new metadata at the controllers' pace, not its disk's."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio

from broker.metadata import metadata_loader
from broker.metadata.metadata_loader import MetadataLoader
from kraft.log.snapshot import list_snapshots
from testsupport.sample_log import Written, write_history


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Written:
    return write_history(tmp_path_factory.mktemp("log") / "log")


def test_a_slow_checkpoint_does_not_hold_up_the_next_batches(
    sample: Written, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk_free = threading.Event()
    writes: list[int] = []
    real_write = metadata_loader.write_checkpoint

    def slow_write(directory: Path, image, previous):  # type: ignore[no-untyped-def]  # test double's args
        assert disk_free.wait(30), "the test never freed the disk"
        writes.append(image.offset)
        return real_write(directory, image, previous)

    monkeypatch.setattr(metadata_loader, "write_checkpoint", slow_write)
    loader = MetadataLoader(None, [], tmp_path / "meta", checkpoint_records=1)
    encoded = [b.encode() for b in sample.batches]
    half = len(encoded) // 2
    end = sample.batches[-1].last_offset + 1

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            loader._background = nursery  # as run() sets it while following the log
            with trio.fail_after(10):
                # caught up with what the controller had then: published; a checkpoint starts
                await loader.on_batches(encoded[:half], sample.batches[half - 1].last_offset + 1)
                first = loader.image.offset
                await loader.on_batches(encoded[half:], end)  # not held up by the disk
            assert loader.image.offset == end - 1 > first == sample.batches[half - 1].last_offset
            assert writes == []  # the first write is still waiting for the disk
            disk_free.set()
            with trio.fail_after(30):
                while not writes:
                    await trio.sleep(0.01)
            loader._background = None

    trio.run(main)
    assert len(writes) == 1 and writes[0] >= sample.batches[half - 1].last_offset
    assert len(list_snapshots(tmp_path / "meta")) == 1


def test_a_checkpoint_copies_unchanged_topics_and_equals_a_fresh_one(
    sample: Written, tmp_path: Path
) -> None:
    """The next checkpoint copies the frames of topics unchanged since the last one; the file is
    byte-identical to one written from scratch."""
    first, latest = sample.images["unfenced"], sample.images["deleted"]
    _, index = metadata_loader.write_checkpoint(tmp_path / "a", first)
    copied, _ = metadata_loader.write_checkpoint(tmp_path / "a", latest, index)
    fresh, _ = metadata_loader.write_checkpoint(tmp_path / "b", latest)
    assert copied.read_bytes() == fresh.read_bytes()
    kept = {t for t, (digest, _, _) in index.topics.items() if t in latest.topics_by_id}
    assert kept and any(latest.topics_by_id[t]._digest == index.topics[t][0] for t in kept)
