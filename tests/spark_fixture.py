"""One module-scoped real SparkSession (local mode) for the audit test modules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def module_spark(master: str, app_name: str) -> Callable[..., Any]:
    """A ``spark`` fixture: a SparkSession on ``master`` for the whole module, stopped after."""

    @pytest.fixture(scope="module")
    def spark(tmp_path_factory: pytest.TempPathFactory) -> Any:
        from tools.audit.session import build_session

        session = build_session(
            master, Path(tmp_path_factory.mktemp("spark")) / "spark.log", app_name=app_name
        )
        yield session
        session.stop()

    return spark
