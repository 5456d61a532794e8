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


def test_txn_offsets_are_durable_and_materialize_on_the_marker_after_a_reload(tmp_path):
    """TxnOffsetCommit records go to the log as the producer's transactional batch; a new
    leader replays them as pending and the commit marker makes them the group's offsets
    (an aborted transaction's are dropped)."""
    rm = ReplicaManager(ME, [tmp_path])
    cluster = Cluster(rm)
    tid = str(uuid.uuid4())
    cluster.step(TopicRecord(OFFSETS_TOPIC, tid), partition(tid, 0, [ME], ME))
    rt = runtime_for(rm)
    rt.publish(None, cluster.image)

    def txn_commit(pid: int, offset: int):
        def fn(shard, token, now):
            parts = [CommitPartition("t", pid, offset, -1, "")]
            result, errors = shard.txn_commit("g", pid, 0, parts, now)
            return result.answer(token, errors)

        return fn

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rt.run)
            await wait_until(lambda: rt.status(0) == E.none)
            assert await rt.write(0, txn_commit(7, 70)) == [E.none]
            assert await rt.write(0, txn_commit(8, 80)) == [E.none]
            part = rm.get_by_name(OFFSETS_TOPIC, 0)
            assert part.log.txns.ongoing  # two open transactions in __consumer_offsets
            part.append_marker(7, 0, True, 0, 0)  # 7 commits; 8 is still open
            rt.shard(0).complete_txn(7, True, 0)

            cluster.step(change(tid, 0, leader=ME))  # a new leader epoch: reload from the log
            rt.publish(None, cluster.image)
            await wait_until(lambda: rt.status(0) == E.none)
            assert rt.loads_done == 2  # a fresh shard, rebuilt from the log
            shard = rt.shard(0)
            [(_, found)] = shard.fetch_offsets("g", [("t", [7, 8])])
            assert [(p, v.offset if v else None) for p, v in found] == [(7, 70), (8, None)]
            assert shard.unstable_offsets("g") == {("t", 8)}
            part.append_marker(8, 0, False, 0, 0)  # 8 aborts

            cluster.step(change(tid, 0, leader=ME))
            rt.publish(None, cluster.image)
            await wait_until(lambda: rt.status(0) == E.none)
            assert rt.loads_done == 3
            shard = rt.shard(0)
            assert shard.unstable_offsets("g") == set()
            [(_, found)] = shard.fetch_offsets("g", [("t", [7, 8])])
            assert [(p, v.offset if v else None) for p, v in found] == [(7, 70), (8, None)]
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_replicated_waits_until_the_high_watermark_covers_the_log(tmp_path):
    """``replicated`` returns only once every record appended so far is replicated (the
    transaction coordinator writes no marker before its Prepare record is durable)."""
    rm = ReplicaManager(ME, [tmp_path])
    cluster = Cluster(rm)
    tid = str(uuid.uuid4())
    cluster.step(TopicRecord(OFFSETS_TOPIC, tid), partition(tid, 0, [ME, 2], ME))
    rt = runtime_for(rm)
    rt.publish(None, cluster.image)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rt.run)
            await wait_until(lambda: rt.status(0) == E.none)
            await rt.replicated(0)  # nothing written: at once
            done: list[str] = []

            async def write_then(what: str) -> None:
                if what == "write":
                    await rt.write(0, commit(7))
                else:
                    await rt.replicated(0)
                done.append(what)

            nursery.start_soon(write_then, "write")
            part = rm.get_by_name(OFFSETS_TOPIC, 0)
            await wait_until(lambda: part.log.log_end_offset == 1)
            nursery.start_soon(write_then, "replicated")
            await trio.sleep(0.2)
            assert done == []  # follower 2 has not fetched the record
            part.on_follower_fetch(2, part.log.log_end_offset, trio.current_time() * 1000)
            await wait_until(lambda: len(done) == 2)
            with pytest.raises(CoordinatorError) as err:
                await rt.replicated(1)  # not led here
            assert err.value.code == E.not_coordinator
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_damaged_coordinator_log_is_reported_and_never_served(tmp_path, caplog):
    """A reload whose read fails its CRC check (damage below the recovery point is found when
    read; injected here at the log's read) is an ERROR naming the partition, the partition
    answers COORDINATOR_NOT_AVAILABLE, and the runtime goes on serving its other partition."""
    from broker.replica.partition_log import CorruptRecordError

    rm = ReplicaManager(ME, [tmp_path])
    cluster = Cluster(rm)
    tid = str(uuid.uuid4())
    cluster.step(
        TopicRecord(OFFSETS_TOPIC, tid),
        partition(tid, 0, [ME, 2], ME),
        partition(tid, 1, [ME, 2], ME),
    )
    rt = runtime_for(rm)
    rt.publish(None, cluster.image)
    part = rm.get_by_name(OFFSETS_TOPIC, 0)

    def failing_read(*args, **kwargs):
        raise CorruptRecordError(f"{part.log.dir}: batch at offset 0 fails its CRC")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rt.run)
            await wait_until(lambda: rt.status(0) == E.none and rt.status(1) == E.none)
            answers: list = []

            async def do_commit() -> None:
                answers.append(await rt.write(0, commit(7)))

            nursery.start_soon(do_commit)
            await wait_until(lambda: part.log.log_end_offset == 1)
            part.on_follower_fetch(2, part.log.log_end_offset, trio.current_time() * 1000)
            await wait_until(lambda: answers)
            part.log.read = failing_read  # the next load finds the damage
            cluster.step(change(tid, 0, leader=2))
            rt.publish(None, cluster.image)
            cluster.step(change(tid, 0, leader=ME))
            rt.publish(None, cluster.image)
            await wait_until(lambda: rt.status(0) == E.coordinator_not_available)
            assert rt.status(1) == E.none
            with pytest.raises(CoordinatorError) as refused:
                rt.shard(0)
            assert refused.value.code == E.coordinator_not_available
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert any(
        r.levelname == "ERROR" and "damaged" in r.getMessage() and "-0" in r.getMessage()
        for r in caplog.records
    )
