"""Features and quorum-level writes: the bootstrap ``metadata.version``, controller activation,
and the idle no-op.

ActivateController is the first write of every newly active controller: a LeaderChangeRecord,
preceded on a log that has no ``metadata.version`` yet by the bootstrap FeatureLevelRecord
(Kafka writes its bootstrap records when the first leader activates on an empty log).
"""

from __future__ import annotations

from kraft.controller.commands import Command, ControllerResult, error_fields
from kraft.controller.settings import ControllerSettings
from kraft.metadata.image import MetadataImage
from kraft.records import FeatureLevelRecord, LeaderChangeRecord, NoOpRecord, Record

METADATA_VERSION = "metadata.version"


def bootstrap_records(image: MetadataImage, settings: ControllerSettings) -> list[Record]:
    """The records an un-bootstrapped log needs first (empty once metadata.version is set)."""
    if METADATA_VERSION in image.features:
        return []
    return [FeatureLevelRecord(METADATA_VERSION, settings.metadata_version)]


def activate_controller(
    image: MetadataImage, cmd: Command, settings: ControllerSettings
) -> ControllerResult:
    """ActivateController {leader_id, term}: [bootstrap records,] LeaderChangeRecord."""
    bootstrap = bootstrap_records(image, settings)
    records = [*bootstrap, LeaderChangeRecord(cmd.body["leader_id"], cmd.body["term"])]
    return ControllerResult(
        records, error_fields(), "bootstrap" if bootstrap else "controller-activated"
    )


def no_op(image: MetadataImage, cmd: Command, settings: ControllerSettings) -> ControllerResult:
    """NoOp: one NoOpRecord, so followers' and brokers' lag keeps moving on an idle cluster."""
    return ControllerResult([NoOpRecord()], error_fields(), "no-op")
