"""The ``kraft`` command's own process: it does not import test libraries (kio would pull in
hypothesis, and through it pytest, wherever the test extras are installed)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from harness import ENV

pytestmark = pytest.mark.integration

PROBE = (
    "import sys, tools.cli, broker.node, kraft.controller_server; "
    "print(sorted(m for m in ('hypothesis', 'pytest', '_pytest') if sys.modules.get(m)))"
)


def test_the_command_and_its_nodes_import_no_test_library(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    assert not (tmp_path / ".hypothesis").exists()
