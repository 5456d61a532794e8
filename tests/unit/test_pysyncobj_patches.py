"""PySyncObj is pinned (pysyncobj==0.3.17) because pykraft patches and uses private members:
fail loudly, naming the member, if an installed PySyncObj lacks one."""

from __future__ import annotations

import socket

import pysyncobj
import pysyncobj.syncobj
from pysyncobj.tcp_connection import TcpConnection

from kraft.quorum import pysyncobj_patches as patches


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
