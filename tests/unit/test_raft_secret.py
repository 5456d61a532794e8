"""The Raft secret is refused when shorter than 32 bytes or readable by group/others, with a
message that says how to fix it; a good one is accepted from the file or the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from kraft.config import ConfigError, ControllerConfig

GOOD = "a-raft-secret-of-exactly-32-byte"


def _props(tmp_path: Path, secret: Path | None = None) -> dict[str, str]:
    props = {
        "node.id": "1",
        "process.roles": "controller",
        "cluster.id": "c",
        "controller.quorum.voters": "1@127.0.0.1:9000",
        "controller.quorum.raft.voters": "1@127.0.0.1:9001",
        "metadata.log.dir": str(tmp_path),
    }
    if secret is not None:
        props["controller.raft.secret.file"] = str(secret)
    return props


def _secret(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "raft.secret"
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def test_a_private_32_byte_secret_is_accepted(tmp_path: Path) -> None:
    assert len(GOOD) == 32
    cfg = ControllerConfig.from_properties(_props(tmp_path, _secret(tmp_path, GOOD)), env={})
    assert cfg.raft_secret == GOOD


def test_a_short_secret_is_refused(tmp_path: Path) -> None:
    path = _secret(tmp_path, GOOD[:31])
    with pytest.raises(ConfigError, match=r"holds 31 bytes; a Raft secret needs at least 32"):
        ControllerConfig.from_properties(_props(tmp_path, path), env={})
    with pytest.raises(ConfigError, match=r"KRAFT_RAFT_SECRET holds 1 bytes"):
        ControllerConfig.from_properties(_props(tmp_path), env={"KRAFT_RAFT_SECRET": "s"})


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_secret_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = _secret(tmp_path, GOOD, mode)
    with pytest.raises(
        ConfigError, match=rf"readable by group or others \(mode 0{mode:o}\).*chmod 600"
    ):
        ControllerConfig.from_properties(_props(tmp_path, path), env={})


def test_a_binary_secret_file_is_refused_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "raft.secret"
    path.write_bytes(b"\xff\xfe" * 40)
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="is not text"):
        ControllerConfig.from_properties(_props(tmp_path, path), env={})
