"""Logging of controller and broker processes: the level, stderr, and an optional rotated file.

The level comes from ``KRAFT_LOG_LEVEL`` when set (any case: ``debug``, ``Info``), else from the
node's ``log.level`` setting. ``log.file`` adds a file that rotates at ``log.file.max.bytes``,
keeping ``log.file.backup.count`` old files, so a node left running for months has a bounded log.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from collections.abc import Mapping
from typing import Any

LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ENV = "KRAFT_LOG_LEVEL"


class LogLevelError(ValueError):
    """A level name that is not one of :data:`LEVELS`."""


def parse_level(text: str, source: str) -> int:
    """The logging level named by ``text`` (case-insensitive; ``WARN`` means ``WARNING``)."""
    name = text.strip().upper()
    name = "WARNING" if name == "WARN" else name
    if name not in LEVELS:
        raise LogLevelError(f"{source}={text!r}: expected one of {', '.join(LEVELS)} (any case)")
    return int(getattr(logging, name))


def level_from(env: Mapping[str, str], configured: str | None = None) -> int:
    """``KRAFT_LOG_LEVEL`` if set, else the configured ``log.level``, else INFO."""
    if env.get(ENV):
        return parse_level(env[ENV], ENV)
    if configured:
        return parse_level(configured, "log.level")
    return logging.INFO


def configure(
    level: int,
    log_file: str | None = None,
    max_bytes: int = 100 * 1024 * 1024,
    backup_count: int = 10,
) -> None:
    """Send the root logger's records to stderr and, with ``log_file``, to a rotating file.

    Called once at start-up and again once the node's config is read; handlers this module
    added earlier are replaced, others (pytest's capture, say) are left alone."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_kraft", False)]:
        root.removeHandler(handler)
        handler.close()
    formatter = logging.Formatter(FORMAT)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(
            logging.handlers.RotatingFileHandler(
                log_file, maxBytes=max_bytes, backupCount=backup_count, encoding="utf-8"
            )
        )
    for handler in handlers:
        handler.setFormatter(formatter)
        handler._kraft = True  # type: ignore[attr-defined]  # marks the handlers we own
        root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger(__name__).debug(
        "logging at %s to stderr%s",
        logging.getLevelName(level),
        f" and {log_file}" if log_file else "",
    )


def configure_from(config: Any) -> None:
    """Configure logging from a node's loaded config (``log.level``, ``log.file``,
    ``log.file.max.bytes``, ``log.file.backup.count``; ``KRAFT_LOG_LEVEL`` wins)."""
    configure(
        level_from(os.environ, config["log.level"]),
        config["log.file"] or None,
        config["log.file.max.bytes"],
        config["log.file.backup.count"],
    )
