"""What a node does when its disk fails it: stop at once, as Kafka does on a log-dir failure.

A write or sync error on the Raft journal, its term/vote file, the metadata log or a snapshot
means this node can no longer persist what it acknowledges (after a failed ``fsync`` the kernel
may already have dropped the dirty pages: retrying it proves nothing). Going on would let it
vote, acknowledge entries and answer reads from state it cannot keep, so
:func:`storage_failed` logs one clear line and ends the process with
:data:`EXIT_STORAGE_FAILURE` without unwinding: no further message leaves this node, the
operating system closes its sockets, and the rest of the quorum carries on without it.

Tests running a quorum in one process replace the exit with :func:`set_failure_handler`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from kraft.storage.meta_properties import mark_stepped_out

log = logging.getLogger("kraft.storage")

EXIT_STORAGE_FAILURE = 3  # distinct from 1 (refused start) and 2 (bad configuration)


class StorageFailure(Exception):
    """Raised by a replaced failure handler (tests); the real one never returns."""


_last_words: Callable[[str], None] | None = None


def set_last_words(fn: Callable[[str], None] | None) -> None:
    """Something the node does just before it exits on a failure (a broker asks the controller
    to fence it at once); ``fn`` must bound its own time. None: nothing."""
    global _last_words
    _last_words = fn


def _halt(message: str) -> NoReturn:
    if _last_words is not None:
        try:
            _last_words(message)
        except Exception:  # the exit must happen whatever the last words did
            log.exception("before stopping")
    print(f"Error: {message}", file=sys.stderr, flush=True)
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:
            pass
    os._exit(EXIT_STORAGE_FAILURE)


_handler: Callable[[str], None] = _halt


def set_failure_handler(handler: Callable[[str], None] | None) -> None:
    """Replace the exit (``None`` restores it). The handler must raise or exit."""
    global _handler
    _handler = handler or _halt


def storage_failed(what: str, path: object, exc: BaseException) -> NoReturn:
    """Log the failure of ``what`` (e.g. "raft journal write") on ``path`` and stop the node."""
    message = (
        f"fatal storage error: {what} failed on {path}: {exc}. This node stops now (exit "
        f"{EXIT_STORAGE_FAILURE}) and takes no further part in the quorum. Free or replace the "
        "disk, then restart it; if its data was damaged, rebuild it with "
        "`kraft storage recover --config FILE --from-peers`."
    )
    log.critical(message)
    _handler(message)
    raise StorageFailure(message)  # a handler that returned: never go on


def node_failed(message: str) -> NoReturn:
    """Stop the node on a fault that is not the disk's (a committed entry that cannot be
    applied): its state can no longer follow the log, so it must not serve or vote."""
    message = f"fatal: {message}. This node stops now (exit {EXIT_STORAGE_FAILURE})."
    log.critical(message)
    _handler(message)
    raise StorageFailure(message)


def step_out(directory: Path, reason: str) -> NoReturn:
    """This controller's metadata log is not the cluster's (``reason`` says why): mark its
    directory so that it refuses to start until rebuilt, then stop the node. A failure to write
    the mark is a storage failure (it stops the node too)."""
    try:
        mark_stepped_out(directory, reason)
    except OSError as e:
        storage_failed("writing the stepped-out mark", directory, e)
    node_failed(
        f"{reason}. It refuses to start until rebuilt from the other controllers: "
        "`kraft storage recover --config FILE --from-peers`"
    )
