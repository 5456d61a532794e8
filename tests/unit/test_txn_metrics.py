"""The transaction coordinator's metrics, over a real replica manager, coordinator runtime
and marker task (no sockets): transactions begun, committed and aborted are counted once their
records are replicated (EndTxn answers once the Prepare record is; the next AddPartitionsToTxn
is held until the markers are), ids are counted by state, and the Prometheus families carry
them."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import trio
from kio.schema.errors import ErrorCode as E

from broker.coordinator.placement import TXN_TOPIC
from broker.coordinator.txn.api import TxnApis
from broker.coordinator.txn.records import ONGOING, PREPARE_ABORT, PREPARE_COMMIT
from broker.coordinator.txn.service import TxnCoordinator
from broker.metadata.metadata_cache import MetadataCache
from broker.metrics import transaction_coordinator_metrics
from broker.protocol.write_txn_markers import MarkerWriter
from broker.replica.replica_manager import ReplicaManager
from kraft.records import TopicRecord
from tests.unit.test_coordinator_runtime import wait_until
from tests.unit.test_replica_manager import ME, Cluster, partition

TID, PID = "txn-1", 1000
V3 = SimpleNamespace(api_version=3)


def setup(tmp_path) -> tuple[ReplicaManager, TxnCoordinator, TxnApis]:
    """``__transaction_state`` on this broker alone (its records commit at once) and topic
    ``d`` with a second replica, broker 2, whose fetches the test makes (so markers wait)."""
    rm = ReplicaManager(ME, [tmp_path])
    cluster = Cluster(rm)
    state_id, data_id = str(uuid.uuid4()), str(uuid.uuid4())
    cluster.step(
        TopicRecord(TXN_TOPIC, state_id),
        partition(state_id, 0, [ME], ME),
        TopicRecord("d", data_id),
        partition(data_id, 0, [ME, 2], ME),
    )
    cache = MetadataCache("c", image=cluster.image)
    txn = TxnCoordinator(SimpleNamespace(values={}), ME, rm, cache, MarkerWriter(rm))
    txn.runtime.publish(None, cluster.image)
    apis = TxnApis(cache, txn, groups=None, ids=None)  # type: ignore[arg-type]  # unused here
    return rm, txn, apis


def add_partitions() -> Any:
    return SimpleNamespace(
        v3_and_below_transactional_id=TID,
        v3_and_below_producer_id=PID,
        v3_and_below_producer_epoch=0,
        v3_and_below_topics=[SimpleNamespace(name="d", partitions=[0])],
    )


def add_code(resp: dict[str, Any]) -> E:
    [topic] = resp["results_by_topic_v3_and_below"]
    [row] = topic["results_by_partition"]
    return E(row["partition_error_code"])


def end_txn(commit: bool) -> Any:
    return SimpleNamespace(
        transactional_id=TID, producer_id=PID, producer_epoch=0, committed=commit
    )


def follower_catches_up(rm: ReplicaManager) -> None:
    part = rm.get_by_name("d", 0)
    part.on_follower_fetch(2, part.log.log_end_offset, trio.current_time() * 1000)


async def start(nursery: trio.Nursery, txn: TxnCoordinator, apis: TxnApis) -> None:
    nursery.start_soon(txn.runtime.run)
    nursery.start_soon(txn.run_markers)
    await wait_until(lambda: txn.runtime.status(0) == E.none)
    await txn.runtime.write(
        0, lambda s, t, now: s.init_producer_id(TID, 60_000, -1, -1, PID, t, now)
    )
    assert add_code(await apis._add_partitions(V3, add_partitions())) == E.none


def test_transactions_begun_committed_and_aborted_are_counted(tmp_path):
    rm, txn, apis = setup(tmp_path)

    async def end(commit: bool) -> dict[str, Any]:
        """EndTxn: answered once the Prepare record is replicated, before the markers (the
        follower of ``d`` has not fetched them)."""
        resp = await apis._end_txn(V3, end_txn(commit))
        state = txn.runtime.shard(0).describe(TID).state
        assert state == (PREPARE_COMMIT if commit else PREPARE_ABORT)
        return resp

    def replicate_markers() -> None:
        follower_catches_up(rm)  # again and again: the marker may not be appended yet

    async def held_add_partitions() -> E:
        """AddPartitionsToTxn meeting the Prepare state is held until the markers are
        replicated, then answered (no CONCURRENT_TRANSACTIONS)."""
        answers: list[E] = []

        async def send() -> None:
            answers.append(add_code(await apis._add_partitions(V3, add_partitions())))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            await trio.sleep(0.2)
            assert answers == []  # held: the marker is not replicated yet
            await wait_until(lambda: (replicate_markers(), answers)[1])
        return answers[0]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await start(nursery, txn, apis)  # begins the first transaction
            assert (await end(True))["error_code"] == E.none
            assert await held_add_partitions() == E.none
            assert txn.runtime.shard(0).describe(TID).state == ONGOING
            assert add_code(await apis._add_partitions(V3, add_partitions())) == E.none  # again
            assert (await end(False))["error_code"] == E.none
            await wait_until(lambda: (replicate_markers(), txn.metrics()["aborted"] == 1)[1])
            m = txn.metrics()
            assert (m["started"], m["committed"], m["aborted"]) == (2, 1, 1)
            assert m["commit_ms_sum"] >= 0 and m["abort_ms_sum"] >= 0
            assert m["txns_by_state"] == {"CompleteAbort": 1}
            assert m["partitions"] == {"loading": 0, "active": 1}
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_transaction_coordinator_metrics_are_rendered():
    m = {
        "txns_by_state": {"Ongoing": 2, "CompleteCommit": 5},
        "partitions": {"loading": 0, "active": 3},
        "started": 7,
        "committed": 5,
        "aborted": 0,
        "commit_ms_sum": 42,
        "abort_ms_sum": 0,
    }
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in transaction_coordinator_metrics(m)
        for s in family.samples
    }
    tcm = "pykraft_transaction_coordinator_"
    assert samples[(tcm + "transactional_ids", (("state", "Ongoing"),))] == 2
    assert samples[(tcm + "transactional_ids", (("state", "PrepareCommit"),))] == 0
    assert samples[(tcm + "num_partitions", (("state", "active"),))] == 3
    assert samples[(tcm + "started_count", ())] == 7
    assert samples[(tcm + "committed_count", ())] == 5
    assert samples[(tcm + "commit_completion_time_ms_count", ())] == 5
    assert samples[(tcm + "commit_completion_time_ms_sum", ())] == 42
    assert samples[(tcm + "abort_completion_time_ms_count", ())] == 0
