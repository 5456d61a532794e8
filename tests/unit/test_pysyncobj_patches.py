"""PySyncObj is pinned (pysyncobj==0.3.17) because pykraft patches and uses private members:
fail loudly, naming the member, if an installed PySyncObj lacks one."""

from __future__ import annotations

import socket

import pysyncobj
import pysyncobj.syncobj
import pytest
from pysyncobj.tcp_connection import TcpConnection

from kraft.quorum import pysyncobj_patches as patches
from kraft.storage.failure import StorageFailure, set_failure_handler


def test_every_patched_and_used_member_exists_in_the_installed_pysyncobj():
    assert patches.missing_members() == []


def test_the_pinned_version_is_installed():
    from importlib.metadata import version

    assert version("pysyncobj") == "0.3.17", pysyncobj.__file__


def test_apply_installs_every_patch_and_is_idempotent():
    patches.apply()
    patches.apply()
    assert patches.applied()
    for owner, name, replacement in patches.PATCHES:
        assert getattr(owner, name) is replacement, name
    assert socket.inet_ntop(socket.AF_INET, b"\x7f\x00\x00\x01") == "127.0.0.1"
    assert pysyncobj.syncobj.createPoller is patches.PATCHES[1][2]
    assert TcpConnection.send is patches._send_message


def test_a_missing_member_is_named_and_refuses_apply(monkeypatch):
    monkeypatch.setattr(patches, "_applied", False)
    monkeypatch.delattr(TcpConnection, "_TcpConnection__trySendBuffer")
    assert patches.missing_members() == ["TcpConnection._TcpConnection__trySendBuffer"]
    try:
        patches.apply()
    except RuntimeError as e:
        assert "TcpConnection._TcpConnection__trySendBuffer" in str(e)
        assert "pysyncobj==0.3.17" in str(e)
    else:
        raise AssertionError("apply() ran with a member missing")


def test_the_instance_attributes_used_are_set_by_syncobj():
    """The private attributes raft.py reads on a running member are assigned somewhere in
    SyncObj's code (their name-mangled names are in its methods' bytecode names)."""
    names: set[str] = set()
    for member in vars(pysyncobj.SyncObj).values():
        code = getattr(getattr(member, "__func__", member), "__code__", None)
        if code is not None:
            names.update(code.co_names)
    missing = [a for a in patches.USED_INSTANCE_ATTRIBUTES if a not in names]
    assert missing == []


def _serializer(path):
    from pysyncobj.serializer import Serializer

    return Serializer(str(path), 0, False, None, None, None)


def test_a_received_snapshot_is_written_chunk_by_chunk(tmp_path):
    patches.apply()
    s = _serializer(tmp_path / "dump.bin")
    assert s.setTransmissionData((b"ab", True, False)) is False
    assert s.setTransmissionData((b"cd", False, False)) is False
    assert s.setTransmissionData((b"ef", False, True)) is True
    assert (tmp_path / "dump.bin").read_bytes() == b"abcdef"
    assert not (tmp_path / "dump.bin.1.tmp").exists()
    assert s.setTransmissionData((b"zz", False, True)) is False  # no transfer begun
    assert s.setTransmissionData(None) is False


def test_a_received_snapshot_that_cannot_be_written_stops_the_node(tmp_path):
    def fail(message: str) -> None:
        raise StorageFailure(message)

    patches.apply()
    (tmp_path / "dump.bin.1.tmp").symlink_to("/dev/full")  # every write: ENOSPC
    s = _serializer(tmp_path / "dump.bin")
    set_failure_handler(fail)
    try:
        with pytest.raises(StorageFailure, match="receiving a raft snapshot"):
            s.setTransmissionData((bytes(1 << 16), True, False))
        missing = _serializer(tmp_path / "no-such-dir" / "dump.bin")
        with pytest.raises(StorageFailure, match="No such file"):
            missing.setTransmissionData((b"x", True, True))
    finally:
        set_failure_handler(None)


def test_a_quiet_link_is_kept_and_a_closed_one_dropped_before_a_send():
    from types import SimpleNamespace

    def conn(sock, last_read):
        c = SimpleNamespace(
            _TcpConnection__lastReadTime=last_read,
            _TcpConnection__timeout=2.0,
            _TcpConnection__socket=sock,
            dropped=False,
        )
        c.disconnect = lambda: setattr(c, "dropped", True)
        return c

    a, b = socket.socketpair()
    try:
        assert patches._open_per_kernel(a)  # open, nothing to read
        quiet = conn(a, patches._monotonic() - 10)
        patches._idle_is_not_dead(quiet)  # silent for 10 s, but open: kept, silence restarts
        assert not quiet.dropped and patches._monotonic() - quiet._TcpConnection__lastReadTime < 1
        b.sendall(b"x")
        assert patches._open_per_kernel(a)  # data waiting, not consumed by the peek
        assert a.recv(1) == b"x"
        b.close()
        assert not patches._open_per_kernel(a)  # end of stream
        closed = conn(a, patches._monotonic() - 10)
        patches._idle_is_not_dead(closed)
        assert closed.dropped
        recent = conn(a, patches._monotonic())
        patches._idle_is_not_dead(recent)  # within the timeout: not even looked at
        assert not recent.dropped
    finally:
        a.close()


def test_no_raft_message_leaves_before_the_session_keys_are_exchanged():
    """PySyncObj marks an outgoing connection CONNECTED before the peer's session key arrives;
    a Raft message sent then would carry no key and make the peer drop the connection. The
    transport refuses to send it (the caller retries, as after any failed send)."""
    from types import SimpleNamespace

    from pysyncobj.tcp_connection import CONNECTION_STATE

    from kraft.quorum.raft import _SyncingTransport

    transport = object.__new__(_SyncingTransport)
    sent: list = []
    synced: list = []
    conn = SimpleNamespace(sendRandKey=None, state=CONNECTION_STATE.CONNECTED, send=sent.append)
    transport._connections = {"peer": conn}
    transport._syncObj = SimpleNamespace(encryptor=object())
    transport._before_send = synced.append
    transport._send_random_sleep_duration = 0
    message = {"type": "append_entries", "term": 3}
    assert transport.send("peer", message) is False
    assert sent == [] and synced == []  # not sent, and the journal not synced for it either
    conn.sendRandKey = b"k" * 32  # the peer's key arrived
    assert transport.send("peer", message) is True
    assert sent == [message] and synced == [message]
