"""Every change pykraft makes to PySyncObj's module-level behaviour, in one place, applied
explicitly by :func:`apply` at start-up (``kraft.controller_server.main`` and ``RaftQuorum.start``; it is
idempotent), never as a side effect of an import (except undoing PySyncObj's own import-time
replacement of ``socket.inet_ntop``, below).

pyproject pins ``pysyncobj==0.3.17``: these patches and ``raft._KraftSyncObj`` use private,
name-mangled members of that version. :func:`missing_members` lists any that a PySyncObj
release no longer has; ``tests/unit/test_pysyncobj_patches.py`` fails loudly on one, and
:func:`apply` refuses to run with one missing.

The patches:

* ``socket.inet_ntop``: PySyncObj's win_inet_pton module (imported by its TCP code) replaces it
  with a Windows-only function on every platform (its inet_pton replacement is guarded, the
  inet_ntop one is not), which breaks inet_ntop for the whole process. The C one goes back
  (from ``_socket``).
* ``pysyncobj.syncobj.createPoller``: also knows ``EPOLL_POLLER`` (trio waits on its fd).
* ``TcpConnection.send`` / ``__processParseMessage`` / ``__processRead`` / ``disconnect``:
  bounded frames before and after authentication, no zlib for small messages, a bytearray
  read buffer, stall bookkeeping (see each function).
* ``TcpConnection.__processConnectionTimeout``: a link that was only quiet is not dropped with
  the message about to be sent (the first vote request between two followers).
* ``Serializer.setTransmissionData``: a snapshot received from the leader is written to disk in
  chunks. PySyncObj logs a failed open or write and returns "not done", so the leader sends it
  again and again while the follower never catches up (a failed close or rename even raised
  into the tick). Here any such error is a storage failure: the node stops (exit 3).
* ``SyncObj._onTick`` / ``__onMessageReceived``: Raft pre-vote and leader stickiness
  (``kraft.quorum.prevote``): a starved follower that wakes up does not depose a live leader.
"""

from __future__ import annotations

import _socket
import logging
import socket
import struct
import zlib
from typing import Any

import pysyncobj.pickle as _pysyncobj_pickle
import pysyncobj.syncobj as _syncobj_module
from pysyncobj.atomic_replace import atomicReplace
from pysyncobj.monotonic import monotonic as _monotonic
from pysyncobj.serializer import Serializer
from pysyncobj.syncobj import SyncObj
from pysyncobj.tcp_connection import TcpConnection

from kraft.quorum import prevote
from kraft.quorum.secret import report_unreadable
from kraft.quorum.trio_ticker import EpollPoller
from kraft.storage.failure import storage_failed

logger = logging.getLogger("kraft.quorum.raft")

# The one exception to "never on import": importing PySyncObj (above) has just broken
# socket.inet_ntop for the whole process, so it is repaired here at once. A process that
# imports kraft.quorum without starting a quorum (the CLI, tests reading psutil's connection
# table) would otherwise be left with the Windows-only stub. apply() repairs it again.
socket.inet_ntop = _socket.inet_ntop

# The originals this module replaces (the patched functions call them).
_ORIGINALS: dict[str, Any] = {
    "createPoller": _syncobj_module.createPoller,
    "_TcpConnection__processRead": TcpConnection._TcpConnection__processRead,
    "disconnect": TcpConnection.disconnect,
    "setTransmissionData": Serializer.setTransmissionData,
}

# PySyncObj reads a whole announced frame before it decrypts (or rejects) it, so a peer that
# announces 2 GiB and streams junk makes it buffer without bound — even with a password. Our own
# messages are far smaller (entries <= group_max_bytes, dump chunks 256 KiB): a frame announcing
# more than this, or a negative length, closes the connection at once.
MAX_RAFT_FRAME_BYTES = 64 << 20
# Before a connection has sent one frame that decrypts with the cluster secret, a frame may announce
# at most this (the handshake's frames are under 100 bytes): junk or an attacker's "64 MiB" frame
# is refused after 1 MiB instead of being read whole on the tick thread.
PRE_AUTH_MAX_FRAME_BYTES = 1 << 20
# A frame started and not finished for this long, or an incoming connection that has not
# completed the handshake (key exchange and its node address) within it, is closed.
STALL_TIMEOUT_S = 5.0

# PySyncObj zlib-compresses every message (~40 us of CPU for a 200-byte ack here, several per
# commit). Ours compress only messages of COMPRESS_MIN_BYTES or more; the rest go as the bare
# pickle, which starts with 0x80 (protocol >= 2) where a zlib stream never does, so a receiver
# tells them apart. (Older pykraft controllers cannot read the bare form: upgrade all together.)
COMPRESS_MIN_BYTES = 64 << 10
_PICKLE_MARK = b"\x80"


def _send_message(conn: Any, message: Any) -> None:
    """``TcpConnection.send``: frame = i32 length | [encrypted] (pickle or zlib(pickle))."""
    if conn.sendRandKey:
        message = (conn.sendRandKey, message)
    data = _pysyncobj_pickle.dumps(message)
    if len(data) >= COMPRESS_MIN_BYTES:
        data = zlib.compress(data, 1)
    if conn.encryptor:
        data = conn.encryptor.encrypt_at_time(data, int(_monotonic()))
    conn._TcpConnection__writeBuffer += struct.pack("i", len(data)) + data
    conn._TcpConnection__trySendBuffer()


def _parse_frame(conn: Any) -> Any:
    """``TcpConnection.__processParseMessage``: the next complete message, or None (and the
    connection closed when the frame announces more than MAX_RAFT_FRAME_BYTES or is not a
    valid message from a peer holding the key)."""
    buf = conn._TcpConnection__readBuffer
    if len(buf) < 4:
        return None
    (size,) = struct.unpack_from("i", buf, 0)
    limit = _frame_limit(conn)
    if not 0 <= size <= limit:
        logger.warning(
            "raft: closing a connection that announced a %d-byte frame (max %d%s)",
            size,
            limit,
            "" if getattr(conn, "kraft_authenticated", False) else " before authentication",
        )
        conn.disconnect()
        return None
    if len(buf) - 4 < size:
        return None
    data = bytes(buf[4 : 4 + size])
    try:
        if conn.encryptor:
            timestamp = conn.encryptor.extract_timestamp(data)
            if timestamp < conn.recvLastTimestamp:
                raise ValueError("frame older than the last one (replayed)")
            conn.recvLastTimestamp = timestamp
            data = conn.encryptor.decrypt(data)
            conn.kraft_authenticated = True
        else:
            raise ValueError("no cluster secret: unencrypted Raft traffic is refused")
        if data[:1] != _PICKLE_MARK:
            data = zlib.decompress(data)
        message = _pysyncobj_pickle.loads(data)
        if conn.recvRandKey:
            rand_key, message = message
            if rand_key != conn.recvRandKey:
                raise ValueError("wrong session key")
    except Exception as exc:  # garbage, a wrong key, a replay: drop the peer
        report_unreadable(conn, exc)
        conn.disconnect()
        return None
    rest = buf[4 + size :]
    conn._TcpConnection__readBuffer = rest
    conn.kraft_partial_since = _monotonic() if rest else None
    return message


def _frame_limit(conn: Any) -> int:
    return (
        MAX_RAFT_FRAME_BYTES
        if getattr(conn, "kraft_authenticated", False)
        else PRE_AUTH_MAX_FRAME_BYTES
    )


EPOLL_POLLER = "kraft-epoll"


def _kraft_create_poller(kind: str) -> Any:
    """PySyncObj's ``createPoller``, plus our epoll poller (trio waits on its descriptor)."""
    return EpollPoller() if kind == EPOLL_POLLER else _ORIGINALS["createPoller"](kind)


def _bounded_read(conn: Any) -> bool:
    """PySyncObj reads while data is available before parsing; stop once the buffer holds an
    oversized announcement or more than the connection's frame limit (1 MiB before it has
    authenticated), so the parse above runs (and can close the connection) before more is read.
    The buffer becomes a bytearray: PySyncObj's ``bytes +=`` copies the whole buffer on every
    8 KiB read, which made reading 64 MiB cost seconds of the tick thread."""
    buf = conn._TcpConnection__readBuffer
    if not isinstance(buf, bytearray):
        conn._TcpConnection__readBuffer = buf = bytearray(buf)
    if not buf:
        conn.kraft_partial_since = None
    more: bool = _ORIGINALS["_TcpConnection__processRead"](conn)
    buf = conn._TcpConnection__readBuffer
    if buf and getattr(conn, "kraft_partial_since", None) is None:
        conn.kraft_partial_since = _monotonic()
    if more and len(buf) >= 4:
        (size,) = struct.unpack_from("i", buf, 0)
        limit = _frame_limit(conn)
        if not 0 <= size <= limit or len(buf) > 4 + limit:
            return False
    return more


def _idle_is_not_dead(conn: Any) -> None:
    """``TcpConnection.__processConnectionTimeout``, run before every send: PySyncObj drops a
    connection that has read nothing for ``connectionTimeout``, and with it the message about to
    be sent. The two followers' link carries nothing while a leader is alive, so the first vote
    request of an election went down with that link, and the candidate waited for a reconnect
    and another election timeout (docs/performance.md, "Other settings"). A link silent that long is dropped only if the kernel
    says it is closed or broken (a peek: EOF or an error); else the send goes ahead and the
    silence counts from now. A hung peer is still found by Raft's own timeouts."""
    if _monotonic() - conn._TcpConnection__lastReadTime <= conn._TcpConnection__timeout:
        return
    sock = conn._TcpConnection__socket
    if sock is not None and _open_per_kernel(sock):
        conn._TcpConnection__lastReadTime = _monotonic()
        return
    conn.disconnect()


def _open_per_kernel(sock: socket.socket) -> bool:
    """Whether a connected socket is still open as far as the kernel knows: nothing to read
    (EAGAIN) or data waiting; False on end of stream or a socket error (a reset peer)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False


def _disconnect_and_forget(conn: Any) -> None:
    """``TcpConnection.disconnect``; an outgoing connection object is reused for the next
    attempt, which must authenticate again before its frames may be large."""
    conn.kraft_authenticated = False
    conn.kraft_partial_since = None
    _ORIGINALS["disconnect"](conn)


def _receive_snapshot_chunk(serializer: Any, data: Any) -> bool:
    """``Serializer.setTransmissionData``: one chunk of a snapshot the leader sends, ``data`` =
    (bytes, is first, is last); True once the whole snapshot is in place. In memory (no file
    name: tests) PySyncObj's own code runs; on disk every I/O error stops the node."""
    if data is None:
        return False
    if serializer._Serializer__fileName is None:
        done: bool = _ORIGINALS["setTransmissionData"](serializer, data)
        return done
    chunk, first, last = data
    path = serializer._Serializer__fileName
    tmp = path + ".1.tmp"
    try:
        if first:
            if serializer._Serializer__incomingTransmissionFile is not None:
                serializer._Serializer__incomingTransmissionFile.close()
            serializer._Serializer__incomingTransmissionFile = open(tmp, "wb")  # noqa: SIM115  # kept open across chunks
        incoming = serializer._Serializer__incomingTransmissionFile
        if incoming is None:
            return False  # a chunk from the middle of a transfer we did not see begin
        incoming.write(chunk)
        if not last:
            return False
        serializer._Serializer__incomingTransmissionFile = None
        incoming.close()
        atomicReplace(tmp, path)
        return True
    except OSError as exc:
        serializer._Serializer__incomingTransmissionFile = None
        storage_failed("receiving a raft snapshot", tmp, exc)


# (owner, member, replacement) of every patch :func:`apply` installs
PATCHES: tuple[tuple[Any, str, Any], ...] = (
    (socket, "inet_ntop", _socket.inet_ntop),
    (_syncobj_module, "createPoller", _kraft_create_poller),
    (TcpConnection, "send", _send_message),
    (TcpConnection, "_TcpConnection__processParseMessage", _parse_frame),
    (TcpConnection, "_TcpConnection__processRead", _bounded_read),
    (TcpConnection, "disconnect", _disconnect_and_forget),
    (TcpConnection, "_TcpConnection__processConnectionTimeout", _idle_is_not_dead),
    (Serializer, "setTransmissionData", _receive_snapshot_chunk),
    *prevote.PATCHES,
)

# PySyncObj members pykraft relies on without replacing them: TcpConnection's buffers are set per
# connection (checked on an instance by the unit test); SyncObj's private methods are overridden
# or called by ``raft._KraftSyncObj``; its private attributes are read on a running member.
USED_CLASS_MEMBERS: tuple[tuple[Any, str], ...] = (
    (TcpConnection, "_TcpConnection__trySendBuffer"),
    (SyncObj, "_SyncObj__applyLogEntries"),
    (SyncObj, "_SyncObj__sendAppendEntries"),
    (SyncObj, "_SyncObj__getEntries"),
    (SyncObj, "_checkCommandsToApply"),
    (SyncObj, "_isLeader"),
    (SyncObj, "_getLeader"),
    (SyncObj, "doTick"),
    (SyncObj, "addOnTickCallback"),
    (SyncObj, "forceLogCompaction"),
    (SyncObj, "getStatus"),
    *prevote.USED_CLASS_MEMBERS,
)
USED_INSTANCE_ATTRIBUTES = (
    "_SyncObj__raftCommitIndex",
    "_SyncObj__newAppendEntriesTime",
    "_SyncObj__raftLog",
    "_SyncObj__noopIDx",
    "_SyncObj__lastResponseTime",
    "_SyncObj__raftNextIndex",
    "_SyncObj__raftElectionDeadline",
    "_SyncObj__pipeNotifier",
    "_poller",
    "raftLastApplied",
    "raftCurrentTerm",
    *prevote.USED_INSTANCE_ATTRIBUTES,
)

_applied = False


def missing_members() -> list[str]:
    """The patched or used class members this PySyncObj does not have (empty when all good)."""
    missing = [
        f"{getattr(owner, '__name__', owner)}.{name}"
        for owner, name, _ in PATCHES
        if not hasattr(owner, name)
    ]
    missing += [
        f"{owner.__name__}.{name}" for owner, name in USED_CLASS_MEMBERS if not hasattr(owner, name)
    ]
    return missing


def apply() -> None:
    """Install every patch (once). Raises RuntimeError naming any member PySyncObj lacks."""
    global _applied
    if _applied:
        return
    missing = missing_members()
    if missing:
        raise RuntimeError(
            "this PySyncObj lacks members pykraft patches or uses: "
            + ", ".join(missing)
            + " (pykraft needs pysyncobj==0.3.17)"
        )
    for owner, name, replacement in PATCHES:
        setattr(owner, name, replacement)
    _applied = True


def applied() -> bool:
    """Whether :func:`apply` has run in this process."""
    return _applied
