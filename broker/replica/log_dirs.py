"""This broker's log dirs and which of them failed (Kafka's LogDirFailureChannel, JBOD).

A write, sync or open error in a partition log means its directory can no longer keep what this
broker acknowledges. With several ``log.dirs`` the broker takes only that directory offline
(:meth:`LogDirs.fail`): its partitions stop being served here (clients get
``KAFKA_STORAGE_ERROR``), the heartbeats report it so the controller moves leadership and ISR
membership of those replicas to other brokers (KIP-858), and the other directories go on. It
stays offline until the broker restarts. The first directory holds the broker's metadata log
(``<log.dirs[0]>/metadata``), so its failure stops the broker (exit 3, after asking to be
fenced), as with a single log dir: a running broker always has that one healthy directory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from kraft.storage import meta_properties
from kraft.storage.failure import storage_failed

log = logging.getLogger("broker.log_dirs")


class KafkaStorageError(Exception):
    """A partition's log dir is offline: the request is answered ``KAFKA_STORAGE_ERROR`` (56)."""


class LogDirs:
    """The broker's log dirs, the offline ones, and who to tell when one goes offline."""

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = [Path(d) for d in dirs]
        self.offline: dict[Path, str] = {}  # directory → what failed, for logs and the state
        self.listeners: list[Callable[[Path], None]] = []
        self._ids: dict[Path, str] = {}

    @property
    def metadata_home(self) -> Path:
        """The log dir that also holds the broker's metadata log."""
        return self.dirs[0]

    def is_offline(self, directory: Path) -> bool:
        return directory in self.offline

    def healthy(self) -> list[Path]:
        return [d for d in self.dirs if d not in self.offline]

    def directory_id(self, directory: Path) -> str:
        """The directory id from its ``meta.properties`` ("" when unreadable), read once:
        Kafka's heartbeats name offline log dirs by these ids."""
        if directory not in self._ids:
            try:
                props = meta_properties.read(directory)
            except (OSError, ValueError):
                props = None
            self._ids[directory] = props.directory_id if props is not None else ""
        return self._ids[directory]

    def fail(self, directory: Path, what: str, exc: OSError, partitions: int) -> None:
        """``what`` failed in log dir ``directory`` (holding ``partitions`` of our partitions):
        take it offline and tell the listeners, or stop the broker when it is the metadata's
        directory or the last healthy one (never returns then). Already offline: nothing."""
        directory = Path(directory)
        if directory in self.offline:
            return
        self.directory_id(directory)  # read now, while it may still be readable
        if directory == self.metadata_home:  # so a running broker always has a healthy dir
            storage_failed(f"{what} (in the log dir holding the metadata log)", directory, exc)
        self.offline[directory] = f"{what} failed: {exc}"
        log.error(
            "log dir %s is offline: %s failed: %s. Its %d partition(s) are no longer served by "
            "this broker (clients get KAFKA_STORAGE_ERROR); the controller moves their "
            "leadership and ISR membership to other brokers. The broker keeps serving its other "
            "log dirs (%s). The directory stays offline until the broker restarts: free or "
            "replace the disk, then restart the broker (or remove the directory from log.dirs: "
            "its replicas are then fetched again from their leaders into the others).",
            directory,
            what,
            exc,
            partitions,
            ", ".join(str(d) for d in self.healthy()),
        )
        for listener in list(self.listeners):
            listener(directory)

    def describe(self) -> list[dict[str, object]]:
        """Each log dir, whether it is offline and why (the broker's state endpoint)."""
        return [
            {"dir": str(d), "offline": d in self.offline, "error": self.offline.get(d, "")}
            for d in self.dirs
        ]
