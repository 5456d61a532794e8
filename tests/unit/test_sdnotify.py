"""kraft.sdnotify: READY=1 reaches a real unix datagram socket (path and abstract), nothing is
sent without NOTIFY_SOCKET, and an unreachable socket is reported, not raised."""

from __future__ import annotations

import socket
from pathlib import Path

from kraft.sdnotify import notify


def test_notify_sends_to_a_path_socket(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(path))
        assert notify("READY=1", {"NOTIFY_SOCKET": str(path)})
        s.settimeout(5)
        assert s.recv(100) == b"READY=1"


def test_notify_sends_to_an_abstract_socket() -> None:
    name = f"kraft-test-{id(object())}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        assert notify("STOPPING=1", {"NOTIFY_SOCKET": "@" + name})
        s.settimeout(5)
        assert s.recv(100) == b"STOPPING=1"


def test_no_socket_no_message_and_a_dead_socket_is_not_fatal(tmp_path: Path) -> None:
    assert not notify("READY=1", {})
    assert not notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "missing")})
