"""A small but realistic metadata log, for the log tools' tests and for warming the audit's JVM
class archive (:mod:`tools.audit.classdata`): the real controller state machine produces the
batches (brokers registering, topics, configs, a fence with elections and ISR shrinks, an
unfence, a preferred election, a delete) and ``MetadataLog`` writes them to disk."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kraft.controller.commands import Command
from kraft.controller.settings import ControllerSettings
from kraft.controller.state_machine import QuorumStateMachine
from kraft.log.metadata_log import MetadataLog
from kraft.metadata.image import MetadataImage
from kraft.records import Batch

CLUSTER = "synthetic"
BROKERS = (101, 102, 103)
T0 = 1_790_000_000_000  # 2026-09-21T...Z: every command is one second after the previous


@dataclass
class Written:
    """What was written: the batches, the image after each named step, and offsets of steps."""

    directory: Path
    batches: list[Batch] = field(default_factory=list)
    images: dict[str, MetadataImage] = field(default_factory=dict)

    def offset(self, step: str) -> int:
        return self.images[step].offset

    def time(self, step: str) -> int:
        return self.images[step].timestamp_ms


class _Writer:
    def __init__(self, directory: Path, segment_bytes: int) -> None:
        self.sm = QuorumStateMachine(ControllerSettings(CLUSTER))
        self.log = MetadataLog.open(directory, segment_bytes=segment_bytes, fsync="never")
        self.out = Written(directory)
        self.n = 0

    def write(
        self, api: str, body: dict[str, Any], principal: str = "User:alice", client_id: str = "cli"
    ) -> dict[str, Any]:
        self.n += 1
        command = Command(
            api,
            body,
            request_id=f"req-{self.n}",
            principal=principal,
            client_id=client_id,
            timestamp_ms=T0 + 1000 * self.n,
            seed=self.n,
            leader_id=1,
        )
        batch, response, _ = self.sm.propose(command, term=1 + self.n // 10)
        if response.get("error_code", 0) != 0:
            raise RuntimeError(f"the sample history's {api} was refused: {response}")
        if batch is not None:
            assert self.sm.last_encoded is not None  # propose encoded the batch it returned
            self.log.append_encoded(self.sm.last_encoded, batch)
            self.out.batches.append(batch)
        return response

    def mark(self, step: str) -> None:
        self.out.images[step] = self.sm.image


def _brokers(w: _Writer) -> None:
    """The controller activated and every broker of :data:`BROKERS` registered and unfenced."""
    w.write("ActivateController", {"leader_id": 1, "term": 1}, principal="controller", client_id="")
    for b in BROKERS:
        r = w.write(
            "BrokerRegistration",
            {
                "broker_id": b,
                "cluster_id": CLUSTER,
                "incarnation_id": str(uuid.UUID(int=b)),
                "listeners": [
                    {
                        "name": "PLAINTEXT",
                        "host": "127.0.0.1",
                        "port": 9000 + b,
                        "security_protocol": "PLAINTEXT",
                    }
                ],
                "rack": f"r{b % 3}",
            },
            client_id=f"broker-{b}",
        )
        w.write(
            "UnfenceBroker",
            {"broker_id": b, "broker_epoch": r["broker_epoch"]},
            principal="controller",
            client_id="",
        )


def write_history(directory: Path, segment_bytes: int = 1 << 20) -> Written:
    """Write the scenario into ``directory``; returns the batches and the image after each step:
    ``brokers``, ``created``, ``configured``, ``fenced``, ``unfenced``, ``deleted``."""
    w = _Writer(directory, segment_bytes)
    _brokers(w)
    w.mark("brokers")
    w.write(
        "CreateTopics",
        {
            "topics": [
                {"name": "orders", "num_partitions": 3, "replication_factor": 3},
                {"name": "scratch", "num_partitions": 1, "replication_factor": 2},
            ]
        },
    )
    w.mark("created")
    w.write(
        "IncrementalAlterConfigs",
        {
            "resources": [
                {
                    "resource_type": "topic",
                    "resource_name": "orders",
                    "ops": [{"name": "retention.ms", "op": "SET", "value": "1000"}],
                }
            ]
        },
        principal="User:bob",
        client_id="ops-tool",
    )
    w.write(
        "IncrementalAlterConfigs",
        {
            "resources": [
                {
                    "resource_type": "topic",
                    "resource_name": "orders",
                    "ops": [{"name": "retention.ms", "op": "SET", "value": "5000"}],
                }
            ]
        },
        principal="User:bob",
        client_id="ops-tool",
    )
    w.mark("configured")
    epoch = w.sm.image.brokers[101].epoch
    w.write(
        "FenceBroker",
        {"broker_id": 101, "broker_epoch": epoch, "reason": "session-timeout"},
        principal="controller",
        client_id="",
    )
    w.mark("fenced")
    w.write(
        "UnfenceBroker",
        {"broker_id": 101, "broker_epoch": epoch},
        principal="controller",
        client_id="",
    )
    w.mark("unfenced")
    w.write("DeleteTopics", {"names": ["scratch"]})
    w.mark("deleted")
    w.log.close()
    return w.out


def write_topics(
    directory: Path,
    names: Sequence[str],
    delete: Sequence[str] = (),
    segment_bytes: int = 1200,
) -> Written:
    """The brokers registered (step ``brokers``), then one CreateTopics batch per name in
    ``names`` (step ``created:<name>``, 2 partitions of 3 replicas), then one DeleteTopics
    batch per name in ``delete`` (step ``deleted:<name>``): a log whose every topic's
    creation is a batch of its own, to damage one and see what follows."""
    w = _Writer(directory, segment_bytes)
    _brokers(w)
    w.mark("brokers")
    for name in names:
        w.write(
            "CreateTopics",
            {"topics": [{"name": name, "num_partitions": 2, "replication_factor": 3}]},
        )
        w.mark(f"created:{name}")
    for name in delete:
        w.write("DeleteTopics", {"names": [name]})
        w.mark(f"deleted:{name}")
    w.log.close()
    return w.out
