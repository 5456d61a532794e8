"""Raft secret diagnostics an operator can act on, with real controller processes: a secret
that is too short or readable by others is refused at start (exit 2, one clear line, no
traceback); a controller holding a different secret is named once, by its Raft address, with
"check controller.raft.secret.file", once (further failures from it at DEBUG)."""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography.fernet import InvalidToken

from kraft.config import write_properties
from kraft.quorum.secret import report_unreadable
from tests.harness import ENV, REPO, kraft, poll
from tools.cluster import pick_free_ports

pytestmark = pytest.mark.integration


def _secret(path: Path, text: str | None = None, mode: int = 0o600) -> Path:
    path.write_text((text or base64.b64encode(os.urandom(32)).decode()) + "\n")
    path.chmod(mode)
    return path


def _controllers(tmp_path: Path, secrets: list[Path]) -> tuple[list[Path], list[int]]:
    ports = pick_free_ports(2 * len(secrets))
    rpc, raft = ports[: len(secrets)], ports[len(secrets) :]
    configs = []
    for i, secret in enumerate(secrets, 1):
        home = tmp_path / f"controller-{i}"
        home.mkdir()
        config = home / "controller.properties"
        write_properties(
            config,
            {
                "node.id": i,
                "process.roles": "controller",
                "cluster.id": "UVpkS5U2QPetTJ21qfSRKw",
                "controller.quorum.voters": ",".join(
                    f"{n}@127.0.0.1:{p}" for n, p in enumerate(rpc, 1)
                ),
                "controller.quorum.raft.voters": ",".join(
                    f"{n}@127.0.0.1:{p}" for n, p in enumerate(raft, 1)
                ),
                "metadata.log.dir": home / "metadata",
                "controller.raft.secret.file": secret,
                "log.file": home / "controller.log",
            },
        )
        configs.append(config)
    return configs, raft


def _run(config: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tools.cli", "controller", "--config", str(config)],
        cwd=REPO,
        env=env or ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    ("text", "mode", "message"),
    [
        ("short-secret", 0o600, "holds 12 bytes; a Raft secret needs at least 32"),
        (None, 0o644, "is readable by group or others (mode 0644)"),
    ],
)
def test_a_weak_secret_is_refused_at_start(
    tmp_path: Path, text: str | None, mode: int, message: str
) -> None:
    secret = _secret(tmp_path / "raft.secret", text, mode)
    (config,), _ = _controllers(tmp_path, [secret])
    proc = _run(config)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert message in err and str(secret) in err and "Traceback" not in err


@pytest.mark.timeout(600)
def test_a_controller_with_another_secret_is_named_once(tmp_path: Path) -> None:
    good = _secret(tmp_path / "raft.secret")
    other = _secret(tmp_path / "other.secret")
    configs, raft = _controllers(tmp_path, [good, good, other])
    for config in configs:
        kraft("storage", "format", "--config", str(config), "--initial-controllers")
    procs = [_run(c) for c in configs]
    logs = [tmp_path / f"controller-{i}" / "controller.log" for i in (1, 2, 3)]
    bad = f"127.0.0.1:{raft[2]}"
    try:

        def errors() -> dict[int, list[str]]:
            """Per controller, its ERROR lines about undecryptable frames. Which side sees them
            depends on which dials which (PySyncObj connects one way per pair), so: any."""
            found = {}
            for i, log in enumerate(logs, 1):
                text = log.read_text() if log.exists() else ""
                found[i] = [
                    ln for ln in text.splitlines() if " ERROR " in ln and "do not decrypt" in ln
                ]
            return found if any(found.values()) else {}

        found = poll(errors, 240, 0.5, what="an error naming the controller with another secret")
        for i, lines in found.items():
            for line in lines:
                assert "check controller.raft.secret.file" in line
                assert i == 3 or bad in line, line  # a good controller names the bad one
            assert len(lines) <= 2, lines  # at most once per peer (controller 3 has two)
            assert "InvalidToken()" not in logs[i - 1].read_text()
    finally:
        for p in procs:
            p.kill()
            p.communicate(timeout=30)


def test_an_undecryptable_peer_is_named_once(caplog: pytest.LogCaptureFixture) -> None:
    conn = SimpleNamespace(kraft_dialed="10.9.9.9:9094")
    with caplog.at_level(logging.DEBUG, logger="kraft.quorum.raft"):
        for _ in range(3):
            report_unreadable(conn, InvalidToken())
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "10.9.9.9:9094" in errors[0].getMessage()
    assert "check controller.raft.secret.file" in errors[0].getMessage()
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 2
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kraft.quorum.raft"):
        report_unreadable(conn, ValueError("frame older than the last one (replayed)"))
    assert "replayed" in caplog.records[0].getMessage()
