"""``meta.properties``: which cluster and node a data directory belongs to (Kafka's file).

Kafka's version 1 fields: ``version``, ``cluster.id``, ``node.id``, ``directory.id`` (a random
id given to the directory when it is formatted: a wiped and re-formatted disk gets a new one).
``kraft storage format`` writes it; a node refuses to start on a directory without it, or with
another cluster's or node's id, and says how to recover (:func:`check_directory`).

A controller's directory formatted to join a running quorum (``--no-initial-controllers``, or
``kraft storage recover``) also holds :data:`JOIN_MARKER`: while it exists the controller
neither campaigns nor grants votes to a candidate without history, and it is removed once the
controller has caught up from a leader (``kraft.quorum.raft``).

A controller that found its metadata log differs from the majority's (:mod:`kraft.divergence`)
writes :data:`STEPPED_OUT_MARKER` before it stops: it refuses to start again until it is rebuilt
with ``kraft storage recover --from-peers`` (which moves the directory aside).
"""

from __future__ import annotations

import base64
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

META_PROPERTIES = "meta.properties"
JOIN_MARKER = "join.properties"
STEPPED_OUT_MARKER = "stepped-out.properties"
VERSION = 1
# Kafka's reserved ids (Uuid.ZERO_UUID, Uuid.ONE_UUID, ...) are never handed out
_RESERVED = {bytes(16), bytes(15) + b"\x01"}


class StorageIdentityError(Exception):
    """A data directory is unformatted, damaged, or belongs to another cluster or node."""


def random_uuid() -> str:
    """A Kafka-style id: 16 random bytes as 22 characters of unpadded base64url, never one of
    the reserved ids and never starting with '-' (it would read as a command-line option)."""
    while True:
        raw = uuid.uuid4().bytes
        text = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        if raw not in _RESERVED and not text.startswith("-"):
            return text


def valid_uuid(text: str) -> bool:
    """True for a 22-character base64url id (16 bytes)."""
    if len(text) != 22:
        return False
    try:
        return len(base64.urlsafe_b64decode(text + "==")) == 16
    except ValueError:
        return False


@dataclass(frozen=True)
class MetaProperties:
    cluster_id: str
    node_id: int
    directory_id: str
    version: int = VERSION

    def render(self) -> str:
        return (
            f"#\n#{time.strftime('%a %b %d %H:%M:%S %Z %Y')}\n"
            f"cluster.id={self.cluster_id}\ndirectory.id={self.directory_id}\n"
            f"node.id={self.node_id}\nversion={self.version}\n"
        )


def parse(text: str, source: str = "meta.properties") -> MetaProperties:
    """Parse a ``meta.properties`` text; a clear :class:`StorageIdentityError` when invalid."""
    props: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise StorageIdentityError(f"{source} line {number}: expected key=value, got {line!r}")
        props[key.strip()] = value.strip()
    missing = [k for k in ("version", "cluster.id", "node.id") if not props.get(k)]
    if missing:
        raise StorageIdentityError(f"{source}: missing {', '.join(missing)}")
    if props["version"] != str(VERSION):
        raise StorageIdentityError(
            f"{source}: version {props['version']!r} is not supported (this pykraft writes {VERSION})"
        )
    try:
        node_id = int(props["node.id"])
    except ValueError:
        raise StorageIdentityError(
            f"{source}: node.id {props['node.id']!r} is not a number"
        ) from None
    directory_id = props.get("directory.id", "")
    if directory_id and not valid_uuid(directory_id):
        raise StorageIdentityError(f"{source}: directory.id {directory_id!r} is not a valid id")
    return MetaProperties(props["cluster.id"], node_id, directory_id)


def read(directory: Path) -> MetaProperties | None:
    """The directory's ``meta.properties``, or None when it has none."""
    path = Path(directory) / META_PROPERTIES
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise StorageIdentityError(f"{path}: unreadable: {e}") from None
    return parse(text, str(path))


def write_atomically(path: Path, text: str) -> None:
    """Write, fsync, rename over ``path``, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(directory: Path, meta: MetaProperties) -> None:
    write_atomically(Path(directory) / META_PROPERTIES, meta.render())


def holds_data(directory: Path) -> bool:
    """True when the directory has any file besides an identity file (data from before
    ``meta.properties`` existed, or a half-wiped directory)."""
    directory = Path(directory)
    if not directory.is_dir():
        return False
    for _root, _dirs, files in os.walk(directory):
        if any(f not in (META_PROPERTIES, JOIN_MARKER) for f in files):
            return True
    return False


def check_directory(
    directory: Path, cluster_id: str, node_id: int, config_path: str
) -> MetaProperties:
    """The directory's identity if it belongs to ``cluster_id``/``node_id``; otherwise a
    :class:`StorageIdentityError` saying what is wrong and what to run."""
    directory = Path(directory)
    meta = read(directory)
    if meta is None:
        if holds_data(directory):
            raise StorageIdentityError(
                f"{directory} holds data but no {META_PROPERTIES} (written by pykraft before "
                "storage formatting existed, or partly wiped). If it is this node's own data, "
                f"adopt it: `kraft storage format --config {config_path} --ignore-formatted`. "
                "If it is damaged, rebuild it from the other controllers: "
                f"`kraft storage recover --config {config_path} --from-peers`."
            )
        raise StorageIdentityError(
            f"{directory} has no {META_PROPERTIES}: its data was wiped, or it was never "
            "formatted. A node never starts on an unformatted directory (it would rejoin as a "
            "blank voter). A controller of a running cluster whose disk was lost: "
            f"`kraft storage recover --config {config_path} --from-peers`, then start it (it "
            "catches up from the leader and votes only after). A broker: `kraft storage format "
            f"--config {config_path}` (it re-replicates its partitions). Only for a brand-new "
            f"cluster: `kraft storage format --config {config_path} --initial-controllers`."
        )
    if meta.cluster_id != cluster_id:
        raise StorageIdentityError(
            f"{directory / META_PROPERTIES} belongs to cluster {meta.cluster_id!r}, but "
            f"{config_path} says cluster.id={cluster_id}: a directory of another cluster, or the "
            "wrong configuration. Point the config at this node's own directory; to reuse the "
            "directory for this cluster, empty it and run `kraft storage format`."
        )
    if meta.node_id != node_id:
        raise StorageIdentityError(
            f"{directory / META_PROPERTIES} belongs to node {meta.node_id}, but {config_path} "
            f"says node.id={node_id}: two nodes' directories swapped, or the wrong config."
        )
    stepped_out = Path(directory) / STEPPED_OUT_MARKER
    if stepped_out.exists():
        reason = stepped_out.read_text(errors="replace").strip().removeprefix("reason=")
        raise StorageIdentityError(
            f"this controller stepped out of the quorum ({stepped_out}): {reason}. Its metadata "
            "log is not the cluster's; rebuild it from the other controllers: "
            f"`kraft storage recover --config {config_path} --from-peers`, then start it."
        )
    return meta


def mark_stepped_out(directory: Path, reason: str) -> None:
    """Record, durably, that this controller's history is not the cluster's (see
    :data:`STEPPED_OUT_MARKER`); one line, so the refusal can quote it."""
    write_atomically(Path(directory) / STEPPED_OUT_MARKER, f"reason={' '.join(reason.split())}\n")


def joining(directory: Path) -> bool:
    return (Path(directory) / JOIN_MARKER).exists()


def clear_join_marker(directory: Path) -> None:
    """The controller has caught up: from now on it campaigns and votes like any voter."""
    path = Path(directory) / JOIN_MARKER
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fd = os.open(Path(directory), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
