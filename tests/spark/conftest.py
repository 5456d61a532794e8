"""Tests that run real Spark in local mode: marked ``spark`` (and ``integration``: a JVM starts)."""

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/spark/" in str(item.path):
            item.add_marker(pytest.mark.spark)
            item.add_marker(pytest.mark.integration)
