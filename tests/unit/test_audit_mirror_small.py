"""Which logs the audit treats as small (C1-only JVM, record table cached): ``Mirror.small``
sums the audited segments' bytes against ``mirror.SMALL_LOG_BYTES``."""

from __future__ import annotations

from pathlib import Path

import pytest

from kraft.log.segment import list_segments
from tests import tamper
from tools.audit import mirror
from tools.audit.mirror import Mirror


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("small") / "log"
    tamper.sample(d, ("created", "fenced"))
    return d


def test_a_log_up_to_the_limit_is_small(
    log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = sum(p.stat().st_size for p in list_segments(log))
    monkeypatch.setattr(mirror, "SMALL_LOG_BYTES", size)
    assert Mirror(log, tmp_path / "m").small()
    monkeypatch.setattr(mirror, "SMALL_LOG_BYTES", size - 1)
    assert not Mirror(log, tmp_path / "m").small()


def test_to_offset_counts_only_the_segments_audited(
    log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    segments = list_segments(log)
    assert len(segments) > 1
    first = segments[0].stat().st_size
    monkeypatch.setattr(mirror, "SMALL_LOG_BYTES", first)
    assert not Mirror(log, tmp_path / "m").small()
    last_of_first = int(segments[1].name[:20]) - 1
    assert Mirror(log, tmp_path / "m", to_offset=last_of_first).small()
