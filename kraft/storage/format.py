"""``kraft storage format``: give a node's data directories their identity (meta.properties).

Kafka's ``kafka-storage.sh format`` shape: refuses a directory that is already formatted
unless ``ignore_formatted`` (which leaves it as it is). A directory holding data but no
``meta.properties`` (written before pykraft had storage formatting) is refused too, and adopted
with ``ignore_formatted``. A controller's fresh directory is formatted either as a member of a
new quorum (``initial=True``: may campaign and vote from an empty journal) or to join a running
one (``initial=False``: the join marker, see :mod:`meta_properties`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kraft.storage import meta_properties as mp
from kraft.storage.meta_properties import StorageIdentityError


@dataclass(frozen=True)
class NodeStorage:
    """What a node's config says about its storage."""

    role: str  # "controller" | "broker"
    cluster_id: str
    node_id: int
    directories: tuple[Path, ...]


def check_cluster_id(cluster_id: str) -> None:
    if not cluster_id or any(ch.isspace() or ch in "=:#!" for ch in cluster_id):
        raise StorageIdentityError(
            f"cluster id {cluster_id!r} is not valid: use `kraft storage random-uuid`"
        )


def format_storage(
    storage: NodeStorage,
    cluster_id: str | None = None,
    *,
    ignore_formatted: bool = False,
    initial: bool | None = None,
) -> list[str]:
    """Format every directory of ``storage``; one report line per directory. Checks all
    directories before writing any, so a refusal changes nothing."""
    cluster_id = cluster_id or storage.cluster_id
    check_cluster_id(cluster_id)
    if cluster_id != storage.cluster_id:
        raise StorageIdentityError(
            f"--cluster-id {cluster_id} differs from cluster.id={storage.cluster_id} in the config"
        )
    plan: list[tuple[Path, str]] = []
    for d in storage.directories:
        meta = mp.read(d)
        if meta is not None:
            if meta.cluster_id != cluster_id or meta.node_id != storage.node_id:
                raise StorageIdentityError(
                    f"{d} is formatted for cluster {meta.cluster_id} node {meta.node_id}, not "
                    f"cluster {cluster_id} node {storage.node_id}; empty it to reuse it"
                )
            if not ignore_formatted:
                raise StorageIdentityError(
                    f"{d} is already formatted (cluster {meta.cluster_id}, node {meta.node_id}); "
                    "use --ignore-formatted to leave it as it is"
                )
            plan.append((d, "skip"))
        elif mp.holds_data(d):
            if not ignore_formatted:
                raise StorageIdentityError(
                    f"{d} holds data but no {mp.META_PROPERTIES} (pykraft from before storage "
                    "formatting); use --ignore-formatted to adopt it as this node's directory"
                )
            plan.append((d, "adopt"))
        else:
            plan.append((d, "new"))
    fresh_controller = storage.role == "controller" and any(a == "new" for _, a in plan)
    if fresh_controller and initial is None:
        raise StorageIdentityError(
            "formatting a controller's empty directory: say --initial-controllers (a member of "
            "a new cluster's quorum) or --no-initial-controllers (it joins a running quorum, "
            "e.g. after its disk was replaced: it votes only once caught up from the leader)"
        )
    lines = []
    for d, action in plan:
        if action == "skip":
            lines.append(f"{d}: already formatted, left as it is")
            continue
        d.mkdir(parents=True, exist_ok=True)
        meta = mp.MetaProperties(cluster_id, storage.node_id, mp.random_uuid())
        if storage.role == "controller" and action == "new" and not initial:
            mp.write_atomically(
                d / mp.JOIN_MARKER, f"cluster.id={cluster_id}\nnode.id={storage.node_id}\n"
            )
        mp.write(d, meta)
        what = "adopted existing data" if action == "adopt" else "formatted"
        joins = storage.role == "controller" and action == "new" and not initial
        lines.append(
            f"{d}: {what} (cluster {cluster_id}, node {storage.node_id}, directory "
            f"{meta.directory_id}{', joins a running quorum' if joins else ''})"
        )
    return lines
