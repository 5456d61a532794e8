"""The controller state machine: the leader's proposals and everyone's replay of batches.

Controller v2 (docs/design.md, "Controller state machine"): only the active controller runs
request handlers. Its :meth:`QuorumStateMachine.propose` validates a command against the
controller's latest image (the committed image plus every batch it has proposed and not yet
seen committed), asks the owning control manager for records and a response, wraps the records
in one :class:`Batch` (base offset = image offset + 1, prev_hash = the image's last hash,
provenance from the command) and replays it into that speculative image. The batch's bytes go
through Raft; on commit every controller replays them verbatim (:meth:`replay_batch`) into its
committed state machine. Nothing here is re-executed on a follower, so a changed handler on one
controller (a rolling upgrade) cannot fork the log.

Request bodies arrive with their types already checked (``kraft/rpc/bodies.py``, at the
controller's dispatch); handlers check values. User errors are response values and never become
a batch. A window of recently written request ids answers a retried command with
``{"duplicate": true, ...}`` instead of writing it twice. Only requests that produced a batch
are remembered, so the window is a function of the log: replaying
a batch adds its id (``replay_batch`` or ``note_replayed_batch``), snapshots carry it
(``snapshot_state()`` → the snapshot header; ``reset(image, request_ids)`` on install, ``seed``
on start-up), and a new active controller starts its speculative state machine from a copy of
the committed one (:meth:`fork`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from kraft.controller import cluster_control, config_control, feature_control, replication_control
from kraft.controller.commands import Command, ControllerResult, error_response
from kraft.controller.election import Resume
from kraft.controller.reads import READS
from kraft.controller.settings import ControllerSettings
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.records import (
    Batch,
    PartitionRecord,
    ProducerIdsRecord,
    Provenance,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    batch_hash,
)
from kraft.rpc.apis import APIS

Handler = Callable[[MetadataImage, Command, ControllerSettings], ControllerResult]

WRITES: dict[str, Handler] = {
    "CreateTopics": replication_control.create_topics,
    "CreatePartitions": replication_control.create_partitions,
    "DeleteTopics": replication_control.delete_topics,
    "ElectLeaders": replication_control.elect_leaders,
    "AlterPartition": replication_control.alter_partition,
    "IncrementalAlterConfigs": config_control.incremental_alter_configs,
    "AlterConfigs": config_control.alter_configs,
    "BrokerRegistration": cluster_control.register_broker,
    "UnregisterBroker": cluster_control.unregister_broker,
    "FenceBroker": cluster_control.fence_broker,
    "UnfenceBroker": cluster_control.unfence_broker,
    "BeginControlledShutdown": cluster_control.begin_controlled_shutdown,
    "LogDirsOffline": cluster_control.log_dirs_offline,
    "AllocateProducerIds": cluster_control.allocate_producer_ids,
    "ActivateController": feature_control.activate_controller,
    "NoOp": feature_control.no_op,
}


class ResumableHandler(Protocol):
    """A stepped broker transition: also takes where its previous step stopped."""

    def __call__(
        self,
        image: MetadataImage,
        cmd: Command,
        settings: ControllerSettings,
        /,
        pending: Resume | None = None,
    ) -> ControllerResult: ...


# Stepped broker transitions whose handlers take ``pending`` (see cluster_control._leave).
_RESUMABLE: dict[str, ResumableHandler] = {
    "FenceBroker": cluster_control.fence_broker,
    "BeginControlledShutdown": cluster_control.begin_controlled_shutdown,
    "UnregisterBroker": cluster_control.unregister_broker,
    "UnfenceBroker": cluster_control.unfence_broker,
}


# the record types a retried request's answer says something about
_SUMMARIZED = frozenset(
    {TopicRecord, PartitionRecord, RemoveTopicRecord, RegisterBrokerRecord, ProducerIdsRecord}
)


def batch_summary(
    batch: Batch, topic_name: Callable[[str], str | None], next_producer_id: int
) -> dict[str, Any]:
    """What a retried request is told about the batch its first attempt wrote: the offsets and
    what the records say (topics created or removed, a broker epoch, a producer-id block).
    ``topic_name`` and ``next_producer_id`` describe the state just before the batch (to name
    removed topics and give a producer-id block's start)."""
    summary: dict[str, Any] = {
        "duplicate": True,
        "request_id": batch.provenance.request_id,
        "api": batch.provenance.api,
        "error_code": 0,
        "error_message": "",
        "base_offset": batch.base_offset,
        "offset": batch.last_offset,
    }
    topics: list[dict[str, Any]] = []
    created: dict[str, dict[str, Any]] = {}
    for record in batch.records:
        if type(record) not in _SUMMARIZED:  # partition changes, configs...: nothing to say
            continue
        if isinstance(record, TopicRecord):
            created[record.topic_id] = {
                "name": record.name,
                "topic_id": record.topic_id,
                "error_code": 0,
                "error_message": "",
                "num_partitions": 0,
                "replication_factor": 0,
            }
            topics.append(created[record.topic_id])
        elif isinstance(record, PartitionRecord):
            if record.topic_id in created:
                created[record.topic_id]["num_partitions"] += 1
                created[record.topic_id]["replication_factor"] = len(record.replicas)
        elif isinstance(record, RemoveTopicRecord):
            topics.append(
                {
                    "name": topic_name(record.topic_id) or "",
                    "topic_id": record.topic_id,
                    "error_code": 0,
                    "error_message": "",
                }
            )
        elif isinstance(record, RegisterBrokerRecord):
            summary["broker_epoch"] = record.broker_epoch
        elif isinstance(record, ProducerIdsRecord):
            start = next_producer_id
            summary["producer_id_start"] = start
            summary["producer_id_len"] = record.next_producer_id - start
    if topics:
        summary["topics"] = topics
    return summary


class QuorumStateMachine:
    """Proposals (active controller) and batch replay (every controller); see the module doc."""

    def __init__(
        self, settings: ControllerSettings, image: MetadataImage = MetadataImage.EMPTY
    ) -> None:
        self.settings = settings
        self.image = image
        self._recent: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._state_lock = threading.Lock()  # image + window change together (snapshot_state)
        self.last_encoded: bytes | None = None  # encoding of the last batch propose() built

    # ---- writes (active controller only) -------------------------------------------------------

    def propose(
        self, command: Command, term: int, resume: Resume | None = None
    ) -> tuple[Batch | None, dict[str, Any], Resume | None]:
        """Run one request's handler against this (speculative) image; return the batch to
        propose (None: nothing to write, e.g. an error or a duplicate), the response body, and
        where a stepped broker transition resumes (``resume`` of its next step, valid only
        while nothing else has been written). The batch is already replayed here; its bytes are
        :attr:`last_encoded`."""
        self.last_encoded = None
        handler = WRITES.get(command.api)
        if handler is None:
            kind = APIS[command.api].kind if command.api in APIS else "unknown"
            return (
                None,
                error_response(
                    ErrorCode.INVALID_REQUEST,
                    f"{command.api!r} is not a replicated write API ({kind}).",
                ),
                None,
            )
        if command.request_id:
            seen = self._recent.get(command.request_id)
            if seen is not None and seen["api"] == command.api:
                return None, dict(seen), None
        try:
            resumable = _RESUMABLE.get(command.api)
            if resumable is not None:
                result = resumable(self.image, command, self.settings, pending=resume)
            else:
                result = handler(self.image, command, self.settings)
        except KraftError as e:
            return None, error_response(e.code, e.message), None
        if not result.records:
            return None, result.response, None
        image = self.image
        batch = Batch(  # format 2: no Raft index/position (Raft has not placed it yet)
            image.offset + 1,
            term,
            0,
            max(command.timestamp_ms, image.timestamp_ms),
            Provenance(
                command.principal, command.client_id, command.request_id, command.api, result.reason
            ),
            image.last_hash,
            tuple(result.records),
        )
        encoded = batch.encode()
        self.replay_batch(batch, encoded)  # a ReplayError here is fatal: let it propagate
        self.last_encoded = encoded
        return batch, result.response, result.pending

    def fork(self) -> QuorumStateMachine:
        """A copy (same image, own dedup window) for a new active controller's proposals."""
        with self._state_lock:
            copy = QuorumStateMachine(self.settings, self.image)
            copy._recent = OrderedDict(self._recent)
        return copy

    def replay_batch(self, batch: Batch, encoded: bytes | None = None) -> None:
        """Replay a batch (a proposal, a committed batch, or the log at start-up) into the image."""
        delta = MetadataDelta(self.image)
        delta.replay_batch(batch, batch_hash(encoded) if encoded is not None else None)
        image = delta.apply()
        with self._state_lock:
            self.note_replayed_batch(batch)
            self.image = image

    def adopt(self, batch: Batch, image: MetadataImage) -> None:
        """Move to ``image``, the result of replaying ``batch`` onto the current image (the
        active controller's speculative state machine already built it)."""
        with self._state_lock:
            self.note_replayed_batch(batch)
            self.image = image

    def note_replayed_batch(self, batch: Batch) -> None:
        """Remember the batch's request id in the dedup window (bounded, oldest out first).
        Call before the image moves past the batch, so removed topics can still be named."""
        image = self.image

        def topic_name(topic_id: str) -> str | None:
            topic = image.topic_by_id(topic_id)
            return None if topic is None else topic.name

        self._note(batch, topic_name, image.next_producer_id)

    def note_before(self, batch: Batch, delta: MetadataDelta) -> None:
        """:meth:`note_replayed_batch` for a batch about to be replayed into ``delta`` (start-up
        replays the whole log into one delta: ``kraft.metadata.replay``'s ``before_batch``)."""
        self._note(batch, delta.current_topic_name, delta.next_producer_id)

    def _note(
        self, batch: Batch, topic_name: Callable[[str], str | None], next_producer_id: int
    ) -> None:
        request_id = batch.provenance.request_id
        if not request_id or self.settings.dedup_window == 0:
            return
        self._recent.pop(request_id, None)
        self._recent[request_id] = batch_summary(batch, topic_name, next_producer_id)
        while len(self._recent) > self.settings.dedup_window:
            self._recent.popitem(last=False)

    def start_at(self, image: MetadataImage) -> None:
        """Adopt ``image``, the log replayed at start-up (its batches already noted)."""
        with self._state_lock:
            self.image = image

    def reset(
        self, image: MetadataImage, request_ids: Iterable[tuple[str, dict[str, Any]]]
    ) -> None:
        """Adopt ``image`` and the dedup window stored with it (a snapshot was installed)."""
        with self._state_lock:
            self._recent = OrderedDict()
            self.seed(request_ids)
            self.image = image

    def seed(self, request_ids: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Add (request id, answer) pairs, oldest first, to the dedup window."""
        for request_id, answer in request_ids:
            self._recent.pop(request_id, None)
            self._recent[request_id] = dict(answer)
        while len(self._recent) > self.settings.dedup_window:
            self._recent.popitem(last=False)

    def snapshot_state(self) -> tuple[MetadataImage, tuple[tuple[str, dict[str, Any]], ...]]:
        """The image and the dedup window at the same offset (for a snapshot), from any thread."""
        with self._state_lock:
            return self.image, tuple(self._recent.items())

    @property
    def recent_request_ids(self) -> list[str]:
        """Request ids in the dedup window, oldest first."""
        return list(self._recent)

    # ---- reads --------------------------------------------------------------------------------

    def read(self, api: str, body: dict[str, Any]) -> dict[str, Any]:
        """Answer a read-only API from the current image."""
        handler = READS.get(api)
        if handler is None:
            return {
                "offset": self.image.offset,
                **error_response(
                    ErrorCode.INVALID_REQUEST,
                    f"{api!r} is not a read API of the controller state machine.",
                ),
            }
        try:
            return handler(self.image, body, self.settings)
        except KraftError as e:
            return {"offset": self.image.offset, **error_response(e.code, e.message)}
