"""The broker's local metadata checkpoint: the last published image, so a restart resumes.

Stored in ``<first log dir>/metadata/`` in the controllers' snapshot format
(:mod:`kraft.log.snapshot`: framed, CRC-checked, SHA-256 footer). On load, the image rebuilt
from the records must also match the checksum in the header. A corrupt or inconsistent
checkpoint is **discarded with a WARNING** (renamed ``*.corrupt``) and the next older one is
tried; with none left the broker refetches the metadata from offset 0.

Each checkpoint copies the frames of topics unchanged since the previous one from that file
(:mod:`kraft.snapshot_image`), as the controllers' snapshots do: at 2M partitions a checkpoint
packs only the topics that changed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from kraft.log.errors import CorruptSnapshotError
from kraft.log.snapshot import list_snapshots
from kraft.metadata.image import MetadataImage
from kraft.snapshot_image import FrameIndex, write_image_snapshot
from kraft.snapshotter import snapshot_state

log = logging.getLogger(__name__)
KEEP = 2


def write_checkpoint(
    directory: Path, image: MetadataImage, previous: FrameIndex | None = None
) -> tuple[Path, FrameIndex]:
    """Write ``image`` as a checkpoint (copying unchanged topics' frames from ``previous``, the
    index of the last one written) and keep only the newest :data:`KEEP`; returns the file and
    its frame index."""
    path, index, _ = write_image_snapshot(directory, image, (), previous)
    for old in list_snapshots(directory)[:-KEEP]:
        old.unlink(missing_ok=True)
    return path, index


def image_from_snapshot(path: Path) -> MetadataImage:
    """Read and verify a snapshot file; raises CorruptSnapshotError (also on checksum mismatch).

    PartitionRecord values are not type-checked one by one while loading: the image checksum
    compared with the header's afterwards covers the exact encoding of every one of them (an
    int and a bool, a string and bytes, an int and a float all encode differently). When the
    load or that comparison fails, the file is read again strictly, so a badly typed value is
    named as :func:`kraft.log.snapshot.read_snapshot` names it."""
    return snapshot_state(path, freeze=True)[0]  # kept for long: out of the GC's reach


def load_checkpoint(directory: Path) -> MetadataImage:
    """The newest valid checkpoint's image, or the empty image."""
    for path in reversed(list_snapshots(directory)):
        try:
            image = image_from_snapshot(path)
        except (CorruptSnapshotError, OSError, ValueError) as e:
            log.warning(
                "metadata checkpoint %s is corrupt (%s); discarding it (renamed to "
                "%s.corrupt) and falling back to an older one or refetching",
                path,
                e,
                path.name,
            )
            os.replace(path, path.with_name(path.name + ".corrupt"))
            continue
        log.info(
            "loaded metadata checkpoint %s: offset %d, checksum %s",
            path.name,
            image.offset,
            image.checksum()[:16],
        )
        return image
    return MetadataImage.EMPTY
