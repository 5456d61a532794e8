"""The systemd units of docs/deploy.md pass ``systemd-analyze verify`` (a subprocess, so not a
unit test); the only complaint allowed is the missing /usr/local/bin/kraft of this machine."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
@pytest.mark.parametrize("role", ["controller", "broker"])
def test_systemd_unit_verifies(tmp_path: Path, role: str) -> None:
    unit = (DEPLOY / "systemd" / f"kraft-{role}@.service").read_text()
    assert "Type=notify" in unit and "KillSignal=SIGTERM" in unit
    instance = tmp_path / f"kraft-{role}@{role}.service"
    instance.write_text(unit)
    out = subprocess.run(
        ["systemd-analyze", "verify", str(instance)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    problems = [
        line
        for line in (out.stdout + out.stderr).splitlines()
        if line.strip() and "/usr/local/bin/kraft is not executable" not in line
    ]
    assert not problems, problems
