"""The coordinator runtime over a real replica manager and partition log: loading answers
COORDINATOR_LOAD_IN_PROGRESS, a commit is answered only once the high watermark covers it,
losing leadership answers NOT_COORDINATOR, and a new leader replays the records."""

from __future__ import annotations

import uuid

import pytest
import trio
from kio.schema.errors import ErrorCode as E

from broker.coordinator.group.records import decode_record, encode_key, encode_value
from broker.coordinator.group.state_machine import CommitPartition, GroupShard
from broker.coordinator.placement import OFFSETS_TOPIC
from broker.coordinator.runtime import CoordinatorError, CoordinatorRuntime
from broker.replica.replica_manager import ReplicaManager
from kraft.records import TopicRecord
from tests.unit.test_replica_manager import ME, Cluster, change, partition


def runtime_for(rm: ReplicaManager) -> CoordinatorRuntime:
    return CoordinatorRuntime(
        rm,
        OFFSETS_TOPIC,
        GroupShard,
        lambda rec: (encode_key(rec[0]), encode_value(rec[1])),
        decode_record,
    )


def commit(offset: int):
    def fn(shard, token, now):
        parts = [CommitPartition("t", 0, offset, -1, "")]
        result, every, per = shard.commit("g", -1, "", None, parts, now)
        return result.answer(token, {"every": every, "per": per})

    return fn


async def wait_until(condition, seconds: float = 5.0) -> None:
    with trio.fail_after(seconds):
        while not condition():
            await trio.sleep(0.01)


def test_load_commit_after_hw_unload_and_reload(tmp_path):
    rm = ReplicaManager(ME, [tmp_path])
    cluster = Cluster(rm)
    tid = str(uuid.uuid4())
    cluster.step(TopicRecord(OFFSETS_TOPIC, tid), partition(tid, 0, [ME, 2], ME))
    rt = runtime_for(rm)
    rt.publish(None, cluster.image)
    assert rt.status(0) == E.coordinator_load_in_progress
    assert rt.status(1) == E.not_coordinator

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rt.run)
            await wait_until(lambda: rt.status(0) == E.none)
            answers: list = []

            async def do_commit(offset: int) -> None:
                try:
                    answers.append(await rt.write(0, commit(offset)))
                except CoordinatorError as e:
                    answers.append(e.code)

            nursery.start_soon(do_commit, 42)
            part = rm.get_by_name(OFFSETS_TOPIC, 0)
            await wait_until(lambda: part.log.log_end_offset == 1)
            await trio.sleep(0.2)
            assert answers == []  # follower 2 has not fetched: the HW has not passed the record
            part.on_follower_fetch(2, part.log.log_end_offset, trio.current_time() * 1000)
            await wait_until(lambda: answers)
            assert answers[0]["per"] == [E.none]

            nursery.start_soon(do_commit, 43)
            await wait_until(lambda: part.log.log_end_offset == 2)
            cluster.step(change(tid, 0, leader=2))  # leadership moves away
            rt.publish(None, cluster.image)
            await wait_until(lambda: len(answers) == 2)
            assert answers[1] == E.not_coordinator and rt.status(0) == E.not_coordinator

            cluster.step(change(tid, 0, leader=ME))  # and comes back: replay the log
            rt.publish(None, cluster.image)
            await wait_until(lambda: rt.status(0) == E.none)
            offsets = rt.shard(0).fetch_offsets("g", [("t", [0])])
            assert offsets[0][1][0][1].offset == 43  # both records are in the leader's log
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_write_to_a_partition_not_led_here_is_not_coordinator(tmp_path):
    rm = ReplicaManager(ME, [tmp_path])
    rt = runtime_for(rm)
    with pytest.raises(CoordinatorError) as err:
        trio.run(rt.write, 3, commit(1))
    assert err.value.code == E.not_coordinator
