"""kraft.metadata.follower: the one FetchMetadata/FetchSnapshot long-poll client.

The loop is driven by a scripted controller (answers in order) on trio's mock clock, so the
delays it waits are exact: none after an answer (the wake-on-commit path has no timer), the
retry delays after failures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from kraft.errors import ErrorCode, KraftError
from kraft.log.segment import FRAME_HEADER
from kraft.metadata.follower import (
    Backoff,
    LogFollower,
    SnapshotFetchError,
    check_snapshot_name,
    fetch_metadata_body,
)


def test_fetch_body_leaves_out_max_bytes_when_not_set() -> None:
    assert fetch_metadata_body(7, 500, None) == {"from_offset": 7, "max_wait_ms": 500}
    assert list(fetch_metadata_body(7, 0, 4096)) == ["from_offset", "max_wait_ms", "max_bytes"]


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    b = Backoff(0.05, 2.0)
    assert [b.next() for _ in range(8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    b.reset()
    assert b.next() == 0.05
    flat = Backoff(0.1, 0.1)
    assert [flat.next() for _ in range(3)] == [0.1, 0.1, 0.1]


@pytest.mark.parametrize("name", ["../x.checkpoint", "a/b.checkpoint", "x.log", ""])
def test_bad_snapshot_names_are_refused(name: str) -> None:
    with pytest.raises(SnapshotFetchError, match="bad name"):
        check_snapshot_name(name)


class Scripted:
    """Answers calls from a script: a dict is an answer, a KraftError is raised."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[float, str, dict[str, Any], dict[str, Any]]] = []

    async def call(self, api: str, body: dict[str, Any], **kw: Any) -> Any:
        self.calls.append((trio.current_time(), api, dict(body), kw))
        answer = self.answers.pop(0)
        if isinstance(answer, KraftError):
            raise answer
        return answer


class Target:
    def __init__(self, stop_after: int) -> None:
        self.offset = 0
        self.seen: list[tuple[str, Any]] = []
        self.stop_after = stop_after

    def next_offset(self) -> int:
        return self.offset

    async def on_batches(self, batches: list[bytes], high_watermark: int) -> bool:
        self.seen.append(("batches", (batches, high_watermark)))
        self.offset += len(batches)
        return len(self.seen) >= self.stop_after

    async def on_snapshot(self, info: dict[str, Any]) -> None:
        self.seen.append(("snapshot", info))
        self.offset = info["end_offset"]


def _run(follower: LogFollower, target: Target) -> None:
    async def main() -> None:
        await follower.follow(target)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def _down() -> KraftError:
    return KraftError(ErrorCode.NETWORK_EXCEPTION, "no controller answered")


def test_answers_are_followed_at_once_and_failures_back_off() -> None:
    client = Scripted(
        [
            {"batches": [b"a", b"b"], "high_watermark": 2, "snapshot": None},
            _down(),
            _down(),
            _down(),
            {"batches": [], "high_watermark": 2, "snapshot": None},
            _down(),
            {"snapshot": {"name": "s.checkpoint", "end_offset": 10, "size": 1}},
            {"batches": [b"c"], "high_watermark": 11, "snapshot": None},
        ]
    )
    errors: list[tuple[int, float]] = []
    follower = LogFollower(
        client,
        max_wait_ms=500,
        timeout=10.5,
        max_bytes=4096,
        attempt_timeout=2.5,
        retry=(0.05, 2.0),
        on_error=lambda e, offset, delay: errors.append((offset, delay)),
    )
    target = Target(stop_after=4)
    _run(follower, target)
    times = [t for t, *_ in client.calls]
    gaps = [round(b - a, 6) for a, b in zip(times, times[1:])]
    # no wait after an answer; 0.05, 0.1, 0.2 after failures; reset to 0.05 after a success
    assert gaps == [0.0, 0.05, 0.1, 0.2, 0.0, 0.05, 0.0]
    assert errors == [(2, 0.05), (2, 0.1), (2, 0.2), (2, 0.05)]
    assert [body["from_offset"] for _, _, body, _ in client.calls] == [0, 2, 2, 2, 2, 2, 2, 10]
    assert all(kw == {"timeout": 10.5, "attempt_timeout": 2.5} for *_, kw in client.calls)
    assert [kind for kind, _ in target.seen] == ["batches", "batches", "snapshot", "batches"]


def test_without_retry_a_failure_raises() -> None:
    follower = LogFollower(Scripted([_down()]), max_wait_ms=0, timeout=1, retry=None)
    with pytest.raises(KraftError):
        _run(follower, Target(stop_after=1))


def _snapshot_bytes(header_len: int, rest: int) -> bytes:
    return FRAME_HEADER.pack(header_len, 0) + b"h" * header_len + b"r" * rest


def _chunks(data: bytes, size: int) -> list[dict[str, Any]]:
    out = []
    for pos in range(0, len(data), size):
        chunk = data[pos : pos + size]
        out.append({"data": chunk, "size": len(data), "done": pos + len(chunk) >= len(data)})
    return out


def _fetch(client: Scripted, path: Path, header_only: bool = False) -> None:
    follower = LogFollower(client, max_wait_ms=0, timeout=1)

    async def main() -> None:
        await follower.fetch_snapshot(
            "s.checkpoint", path, max_bytes=4, timeout=3, header_only=header_only
        )

    trio.run(main)


def test_fetch_snapshot_streams_the_whole_file(tmp_path: Path) -> None:
    data = _snapshot_bytes(10, 30)
    client = Scripted(_chunks(data, 4))
    _fetch(client, tmp_path / "s")
    assert (tmp_path / "s").read_bytes() == data
    assert [body["position"] for _, _, body, _ in client.calls] == list(range(0, len(data), 4))


def test_fetch_snapshot_header_only_stops_after_the_header(tmp_path: Path) -> None:
    data = _snapshot_bytes(10, 30)
    client = Scripted(_chunks(data, 4))
    _fetch(client, tmp_path / "s", header_only=True)
    got = (tmp_path / "s").read_bytes()
    assert data.startswith(got) and len(got) == 20  # 8 + 10 bytes, read in chunks of 4
    assert len(client.answers) == len(_chunks(data, 4)) - 5


def test_fetch_snapshot_cut_short_is_an_error(tmp_path: Path) -> None:
    client = Scripted([{"data": b"abcd", "size": 10, "done": False}, {"data": b"", "size": 10}])
    with pytest.raises(SnapshotFetchError, match="ended at byte 4 of 10"):
        _fetch(client, tmp_path / "s")
