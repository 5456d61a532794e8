"""A failed log dir among several (JBOD, KIP-858): the broker takes only it offline, the heartbeat
reports its replicas, and the active controller moves them out of ISRs and leadership."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.protocol.produce import ProduceHandler
from broker.replica.replica_manager import ReplicaManager
from kraft.controller.cluster_control import log_dirs_offline, unfence_broker
from kraft.controller.commands import Command
from kraft.controller.election import changes_for_offline_replicas
from kraft.controller.heartbeats import BrokerHeartbeatManager
from kraft.controller.settings import ControllerSettings
from kraft.errors import ErrorCode
from kraft.records import (
    FENCE,
    LEADER_NONE,
    RECOVERING,
    BrokerRegistrationChangeRecord,
    TopicRecord,
)
from kraft.storage import failure
from tests.unit.test_heartbeats import apply, registered
from tests.unit.test_partition_log import make_batch
from tests.unit.test_replica_manager import Cluster, partition
from tests.unit.test_storage_failure import file_size_limit

T = str(uuid.UUID(int=7))
U = str(uuid.UUID(int=8))
SETTINGS = ControllerSettings(cluster_id="c")


@pytest.fixture()
def failures() -> Iterator[list[str]]:
    """Storage failures that would stop the broker, recorded (and raised) instead."""
    seen: list[str] = []

    def record(message: str) -> None:
        seen.append(message)
        raise failure.StorageFailure(message)

    failure.set_failure_handler(record)
    try:
        yield seen
    finally:
        failure.set_failure_handler(None)


def image_with_partitions():
    """Brokers 1-3 unfenced; topic t: p0 led by 1, p1 led by 2 with 1 in its ISR, p2 led by 1
    alone in its ISR, p3 without broker 1; topic u: p0 led by 2 with 1 in the ISR."""
    return apply(
        registered(1, 2, 3, fenced=False),
        TopicRecord("t", T),
        partition(T, 0, [1, 2, 3], 1),
        partition(T, 1, [2, 1], 2),
        partition(T, 2, [1, 2], 1, isr=[1]),
        partition(T, 3, [2, 3], 2),
        TopicRecord("u", U),
        partition(U, 0, [2, 1], 2),
    )


# ---- the controller (pure) --------------------------------------------------------------------


def test_offline_replicas_leave_isr_and_leadership_but_the_last_isr_member_stays():
    image = image_with_partitions()
    offline = [(T, 0), (T, 1), (T, 2), (T, 3), ("no-such-topic", 0)]
    changes = changes_for_offline_replicas(image, 1, offline)
    by_pid = {c.partition_id: c for c in changes}
    assert sorted(by_pid) == [0, 1, 2]  # p3 has no replica on broker 1; unknown ones skipped
    assert (by_pid[0].leader, by_pid[0].isr, by_pid[0].election) == (2, (2, 3), "clean")
    assert by_pid[1].isr == (2,) and by_pid[1].election is None  # leader 2 stays
    assert (by_pid[2].leader, by_pid[2].isr) == (LEADER_NONE, None)  # ISR never emptied
    after = apply(image, *changes)
    assert changes_for_offline_replicas(after, 1, offline) == []  # nothing left to move
    # u-0 was not reported: broker 1 stays in its ISR (only the failed dir's replicas move)
    assert 1 in after.topics_by_id[U].partitions[0].isr


def test_an_offline_replica_is_never_elected_even_uncleanly():
    """Broker 1 is t-2's only ISR member and its first replica: with unclean elections allowed,
    broker 2 takes over (RECOVERING) rather than the offline replica staying leader."""
    image = image_with_partitions()
    (change,) = changes_for_offline_replicas(image, 1, [(T, 2)], unclean_allowed=lambda _: True)
    assert (change.leader, change.isr, change.election) == (2, (2,), "unclean")
    assert change.leader_recovery_state == RECOVERING


def test_heartbeat_asks_for_log_dirs_offline_until_the_replicas_have_moved():
    m = BrokerHeartbeatManager(9000)
    image = image_with_partitions()
    epoch = image.brokers[1].epoch
    offline = ((T, 0), (T, 2), (T, 3))

    def beat(img):
        return m.heartbeat(
            1, epoch, img.offset, False, False, 1000, img,
            offline_log_dirs=("/data/b",), offline_replicas=offline,
        )  # fmt: skip

    decision = beat(image)
    assert not decision.is_fenced and not decision.should_shut_down
    api, body = decision.command
    assert api == "LogDirsOffline" and body["broker_epoch"] == epoch
    assert body["offline_replicas"] == [
        {"topic_id": T, "partition": 0},
        {"topic_id": T, "partition": 2},
    ]  # t-3 has no replica here
    assert m.offline(1) == (("/data/b",), 3)
    result = log_dirs_offline(image, Command(api, body), SETTINGS)
    assert result.reason == "log-dir-offline" and result.response["error_code"] == 0
    moved = apply(image, *result.records)
    assert beat(moved).command is None  # repeated in every heartbeat: nothing more to do
    m.register(1, epoch + 100, 2000)  # a restart (new epoch) forgets what was offline
    assert m.offline(1) == ((), 0)


def test_log_dirs_offline_refuses_a_stale_epoch_and_writes_nothing_for_a_fenced_broker():
    image = image_with_partitions()
    epoch = image.brokers[1].epoch
    replicas = [{"topic_id": T, "partition": 0}]
    stale = log_dirs_offline(
        image,
        Command("LogDirsOffline", {"broker_id": 1, "broker_epoch": epoch - 1,
                                   "offline_replicas": replicas}),
        SETTINGS,
    )  # fmt: skip
    assert stale.records == [] and stale.response["error_code"] == ErrorCode.STALE_BROKER_EPOCH
    fenced = apply(image, BrokerRegistrationChangeRecord(1, epoch, FENCE, 0))
    body = {"broker_id": 1, "broker_epoch": epoch, "offline_replicas": replicas}
    assert log_dirs_offline(fenced, Command("LogDirsOffline", body), SETTINGS).records == []


def test_log_dirs_offline_moves_one_step_at_a_time():
    image = image_with_partitions()
    settings = ControllerSettings(cluster_id="c", transition_step_records=2)
    body = {
        "broker_id": 1,
        "broker_epoch": image.brokers[1].epoch,
        "offline_replicas": [{"topic_id": T, "partition": p} for p in range(3)]
        + [{"topic_id": U, "partition": 0}],
    }
    first = log_dirs_offline(image, Command("LogDirsOffline", body), settings)
    assert len(first.records) == 2 and first.response["incomplete"] is True
    image = apply(image, *first.records)
    second = log_dirs_offline(image, Command("LogDirsOffline", body), settings)
    assert len(second.records) == 2 and "incomplete" not in second.response


def test_unfencing_never_makes_an_offline_replica_leader():
    """A broker fenced (say, a lost session) while a log dir is offline comes back: the leaderless
    partitions it is the last ISR member of get it as leader, except those on the offline dir."""
    image = apply(
        registered(1, 2, fenced=False),
        TopicRecord("t", T),
        partition(T, 0, [1, 2], LEADER_NONE, isr=[1]),
        partition(T, 1, [1, 2], LEADER_NONE, isr=[1]),
    )
    epoch = image.brokers[1].epoch
    image = apply(image, BrokerRegistrationChangeRecord(1, epoch, FENCE, 0))
    m = BrokerHeartbeatManager(9000)
    decision = m.heartbeat(  # caught up: its metadata offset is past its registration
        1, epoch, epoch + 10, False, False, 1000, image, offline_replicas=((T, 1),)
    )
    api, body = decision.command
    assert api == "UnfenceBroker"
    result = unfence_broker(image, Command(api, body), SETTINGS)
    led = {r.partition_id: r.leader for r in result.records if hasattr(r, "partition_id")}
    assert led == {0: 1}  # t-1 stays leaderless: its replica here is on the offline dir


# ---- the broker --------------------------------------------------------------------------------


def two_dir_broker(tmp_path: Path) -> tuple[ReplicaManager, Cluster]:
    """Broker 1 with log dirs a (the metadata's) and b, leading t-0 (in a) and t-1 (in b)."""
    rm = ReplicaManager(1, [tmp_path / "a", tmp_path / "b"])
    c = Cluster(rm)
    c.step(TopicRecord("t", T), partition(T, 0, [1, 2], 1), partition(T, 1, [1, 2], 1))
    assert [rm.get(T, p).log.dir.parent.name for p in (0, 1)] == ["a", "b"]
    return rm, c


def test_a_write_error_in_a_second_log_dir_takes_only_that_dir_offline(
    tmp_path: Path,
    failures: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    rm, c = two_dir_broker(tmp_path)
    produce = ProduceHandler(rm)
    seen: list[Path] = []
    rm.dirs.listeners.append(seen.append)
    with file_size_limit(1):
        result, part, _ = produce._append("t", 1, make_batch([b"x" * 5000]), acks=1)
    assert result.error_code == ErrorCode.KAFKA_STORAGE_ERROR and part is None
    assert failures == [] and seen == [tmp_path / "b"]  # the broker goes on
    assert "log dir %s is offline" % (tmp_path / "b") in caplog.text
    assert "File too large" in caplog.text
    assert rm.get(T, 1) is None and rm.is_offline("t", 1)
    result, _, _ = produce._append("t", 1, make_batch([b"y"]), acks=1)
    assert result.error_code == ErrorCode.KAFKA_STORAGE_ERROR  # and it stays so
    result, _, _ = produce._append("t", 0, make_batch([b"z"]), acks=1)
    assert result.error_code == 0  # the healthy dir still serves
    report = rm.offline_report()
    assert report["offline_log_dir_paths"] == [str(tmp_path / "b")]
    assert report["offline_replicas"] == [{"topic_id": T, "partition": 1}]
    # later metadata for the offline replica is ignored; new replicas go to the healthy dir
    c.step(partition(T, 2, [1], 1), partition(T, 3, [1], 1))
    assert rm.get(T, 1) is None
    assert {rm.get(T, p).log.dir.parent.name for p in (2, 3)} == {"a"}
    rm.checkpoint_high_watermarks()
    rm.close()


def test_a_write_error_in_the_metadata_log_dir_still_stops_the_broker(
    tmp_path: Path,
    failures: list[str],
) -> None:
    rm, _ = two_dir_broker(tmp_path)
    produce = ProduceHandler(rm)
    with file_size_limit(1), pytest.raises(failure.StorageFailure):
        produce._append("t", 0, make_batch([b"x" * 5000]), acks=1)
    (message,) = failures
    assert "in the log dir holding the metadata log" in message


def test_operators_see_the_offline_dir_in_metrics_and_cluster_describe(tmp_path: Path) -> None:
    from broker.metrics import log_dir_metrics
    from broker.replica.log_dirs import LogDirs
    from tools.commands.cluster_cmd import render_describe

    dirs = LogDirs([tmp_path / "a", tmp_path / "b"])
    dirs.offline[tmp_path / "b"] = "partition log write failed: [Errno 28]"
    count, per_dir = log_dir_metrics(dirs)
    assert count.samples[0].value == 1
    assert {s.labels["logDirectory"]: s.value for s in per_dir.samples} == {
        str(tmp_path / "a"): 0,
        str(tmp_path / "b"): 1,
    }
    broker = {"broker_id": 1, "epoch": 5, "state": "unfenced", "listeners": []}
    text = render_describe({"brokers": [{**broker, "offline_log_dirs": ["/d/b"]}, broker]})
    assert "unfenced, log dir(s) offline: /d/b" in text
    assert render_describe({"brokers": [broker]}).count("offline") == 0
