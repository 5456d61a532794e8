"""Unit tests are pure: no network sockets and no subprocesses.

Listening on or connecting an internet socket, or starting a process, fails the test at once, so a
test that needs real processes is moved to ``tests/integration`` instead of slowing ``make unit``.
(Unix socket pairs stay allowed: trio's run loop wakes itself through one. Binding to probe for
a free port is allowed too: the cluster planner does it.)
"""

import socket
import subprocess

import pytest
import trio  # noqa: F401  (imported before the guard: trio runs ldconfig once on first import)

_INET = (socket.AF_INET, socket.AF_INET6)


def _refuse(what: str):
    def guard(*args, **kwargs):
        raise RuntimeError(f"unit tests may not {what}; move this test to tests/integration")

    return guard


@pytest.fixture(autouse=True)
def _pure(monkeypatch: pytest.MonkeyPatch) -> None:
    real_listen, real_connect = socket.socket.listen, socket.socket.connect

    def listen(self: socket.socket, *backlog: int) -> None:
        if self.family in _INET:
            _refuse("listen on a network socket")()
        real_listen(self, *backlog)

    def connect(self: socket.socket, address):  # type: ignore[no-untyped-def]  # socket.connect's address has no stub type
        if self.family in _INET:
            _refuse("connect a network socket")()
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "listen", listen)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("start a subprocess"))
