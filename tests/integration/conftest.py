"""Every test here starts real processes or sockets on loopback: marked ``integration``.

Shared fixtures: ``cluster``, an unstarted :class:`harness.LocalCluster` in the test's own
directory, brought down afterwards whatever the test did (modules that share one running
cluster between their tests define their own module-scoped ``cluster``)."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import LocalCluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "cluster")
    try:
        yield c
    finally:
        c.down()
