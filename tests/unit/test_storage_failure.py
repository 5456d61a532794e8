"""A real write error (EFBIG past RLIMIT_FSIZE) on a broker's partition log stops the broker."""

from __future__ import annotations

import contextlib
import resource
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.replica.partition import Partition
from broker.replica.partition_log import PartitionLog
from kraft.storage import failure
from tests.unit.test_partition_log import make_batch


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Writes past ``limit`` bytes fail with EFBIG (SIGXFSZ ignored) while inside."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


@pytest.fixture()
def failures() -> Iterator[list[str]]:
    seen: list[str] = []

    def record(message: str) -> None:
        seen.append(message)
        raise failure.StorageFailure(message)

    failure.set_failure_handler(record)
    try:
        yield seen
    finally:
        failure.set_failure_handler(None)


def test_a_failed_partition_log_write_stops_the_broker(tmp_path: Path, failures: list[str]) -> None:
    part = Partition(
        "t", "tid", 0, PartitionLog.open(tmp_path / "t-0"), role="leader", leader=1,
        leader_epoch=0, partition_epoch=0, isr=(1,), replicas=(1,),
    )  # fmt: skip
    part.log.assign_epoch(0, 0)
    part.reset_followers(1, now_ms=0)
    assert part.append_as_leader(make_batch([b"a"])).last_offset == 0
    with file_size_limit(1), pytest.raises(failure.StorageFailure):
        part.append_as_leader(make_batch([b"b" * 5000]))
    (message,) = failures
    assert "fatal storage error: partition log write failed" in message
    assert str(tmp_path / "t-0") in message and "File too large" in message
