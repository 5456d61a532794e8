"""``python -m testsupport.image_corrupter --trigger FILE CONFIG``: a real broker (``kraft
broker --config CONFIG``) whose metadata image a test can corrupt, for the image-check tests.

The hook lives only here: the broker's own code has none (installed code never imports
``testsupport``). This process patches its metadata loader's publish step before running the
broker's ``main``: after each publish, if ``FILE`` exists, the image the loader keeps (the one
the next delta builds on and the image check compares) becomes a corrupted copy, with
``next_producer_id`` moved by 1000 (a field brokers never act on, so only the checksum sees it).
``FILE`` holds the mode: ``once`` corrupts the next published image and deletes ``FILE`` (a
transient fault: reloading repairs it); ``always`` corrupts every published image while
``FILE`` exists (a replay bug: reloading cannot repair it).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kraft.metadata.image import MetadataImage

log = logging.getLogger("testsupport.image_corrupter")


def corrupted(image: MetadataImage) -> MetadataImage:
    """``image`` with ``next_producer_id`` moved by 1000 (a different checksum)."""
    return dataclasses.replace(image, next_producer_id=image.next_producer_id + 1000)


def install(trigger: Path) -> None:
    """Patch the broker's ``MetadataLoader`` so that ``trigger`` (module doc) corrupts its
    image."""
    from broker.metadata.metadata_loader import MetadataLoader

    publish = MetadataLoader._publish

    def corrupting_publish(self: MetadataLoader, delta: Any, full: bool) -> None:
        publish(self, delta, full)
        try:
            mode = trigger.read_text().strip()
        except FileNotFoundError:
            return
        self.image = corrupted(self.image)
        log.warning("test hook: corrupted the metadata image at offset %d", self.image.offset)
        if mode == "once":
            trigger.unlink(missing_ok=True)

    MetadataLoader._publish = corrupting_publish  # type: ignore[method-assign]  # the test hook


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trigger", type=Path, required=True, help="the mode file (module doc)")
    ap.add_argument("config", help="the broker's properties file")
    a = ap.parse_args(argv)
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]  # as `kraft broker`
    install(a.trigger)
    from broker.node import main as broker_main

    return int(broker_main(a.config) or 0)


if __name__ == "__main__":
    sys.exit(main())
