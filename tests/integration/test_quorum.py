"""RaftQuorum: three PySyncObj members on loopback, plus group commit in isolation.

Each member runs on a thread of its own with its own trio loop (:class:`Member`), as it would in
its own process: a member's Raft ticks run on its trio thread, so members sharing one loop would
stall each other (a long apply on the leader would hold back the followers' ticks too)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
import trio.testing
from pysyncobj import FAIL_REASON

from kraft.errors import ErrorCode, KraftError
from kraft.quorum import RaftQuorum, RaftSettings
from kraft.quorum.group_commit import GroupCommitter
from tools.free_ports import pick_free_ports

pytestmark = pytest.mark.timeout(120)


def trio_test(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        trio.run(functools.partial(fn, *args, **kwargs))

    return wrapper


class ListTarget:
    """Deterministic apply side: a list of commands; remembers the last applied raft index."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.commands: list[bytes] = []
        self.entries: list[tuple[int, int, int]] = []  # (raft_index, term, n commands)
        self.last_index = 0
        self.sync_probe: Callable[[], int] | None = None
        self.unsynced_at_apply: list[tuple[int, int]] = []
        self.loads = 0

    def apply_entry(self, raft_index: int, term: int, commands: list[bytes]) -> list[Any]:
        with self.lock:
            assert raft_index > self.last_index, (raft_index, self.last_index)
            if self.sync_probe is not None:
                synced = self.sync_probe()
                if synced < raft_index:
                    self.unsynced_at_apply.append((raft_index, synced))
            results = []
            for c in commands:
                self.commands.append(c)
                results.append((raft_index, len(self.commands) - 1))
            self.entries.append((raft_index, term, len(commands)))
            self.last_index = raft_index
            return results

    def last_applied_raft_index(self) -> int:
        return self.last_index

    def dump(self) -> bytes:
        with self.lock:
            return msgpack.packb({"commands": self.commands, "last": self.last_index})

    def load(self, data: bytes) -> None:
        d = msgpack.unpackb(data)
        with self.lock:
            self.commands = list(d["commands"])
            self.last_index = d["last"]
            self.loads += 1

    def snapshot(self) -> list[bytes]:
        with self.lock:
            return list(self.commands)


class Member:
    """A ``RaftQuorum`` on a thread with its own trio loop; the test's loop talks to it through
    the methods below (each runs on the member's thread)."""

    def __init__(
        self,
        nid: int,
        addr: str,
        partners: dict[int, str],
        raft_dir: Path,
        target: Any,
        settings: RaftSettings,
    ) -> None:
        self.node_id = nid
        self.quorum = RaftQuorum(nid, addr, partners, raft_dir, target, settings)
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._nursery: trio.Nursery | None = None
        self._error: BaseException | None = None
        started = threading.Event()

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            try:
                self.quorum.start()
            except BaseException as exc:
                self._error = exc
                started.set()
                return
            try:
                async with trio.open_nursery() as self._nursery:
                    started.set()
                    await self._stop.wait()
                    self._nursery.cancel_scope.cancel()
            finally:
                self.quorum.close()

        self._thread = threading.Thread(
            target=trio.run, args=(main,), name=f"member-{nid}", daemon=True
        )
        self._thread.start()
        if not started.wait(30):
            raise TimeoutError(f"member {nid} did not start")
        if self._error is not None:
            raise self._error

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the member's trio thread; its result (blocks this thread briefly)."""
        assert self._token is not None
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

        self._token.run_sync_soon(run)
        return future.result(timeout=30)

    async def submit(self, command: bytes, timeout: float) -> Any:
        token = self._token
        return await trio.to_thread.run_sync(
            functools.partial(
                trio.from_thread.run, self.quorum.submit, command, timeout, trio_token=token
            )
        )

    @property
    def is_leader(self) -> bool:
        return self.call(lambda: self.quorum.is_leader)

    @property
    def leader_id(self) -> int | None:
        return self.call(lambda: self.quorum.leader_id)

    @property
    def term(self) -> int:
        return self.call(lambda: self.quorum.term)

    def stats(self) -> dict[str, int]:
        return self.call(self.quorum.stats)

    def status(self) -> dict[str, Any]:
        return self.call(self.quorum.status)

    def force_compaction(self) -> None:
        self.call(self.quorum.force_compaction)

    def leadership_events(self) -> trio.MemoryReceiveChannel[tuple[bool, int]]:
        """The member's leadership events, relayed into the calling trio loop."""
        send, recv = trio.open_memory_channel[tuple[bool, int]](64)
        here = trio.lowlevel.current_trio_token()

        def subscribe() -> None:
            events = self.quorum.leadership_events()

            async def relay() -> None:
                async for event in events:
                    here.run_sync_soon(send.send_nowait, event)

            assert self._nursery is not None
            self._nursery.start_soon(relay)

        self.call(subscribe)
        return recv

    def close(self) -> None:
        if self._thread.is_alive() and self._token is not None and self._stop is not None:
            try:
                self._token.run_sync_soon(self._stop.set)
            except trio.RunFinishedError:
                pass
        self._thread.join(30)
        assert not self._thread.is_alive(), f"member {self.node_id} did not stop"


class Cluster:
    def __init__(self, tmp: Path, size: int = 3, **settings: Any) -> None:
        ports = pick_free_ports(size)
        self.addrs = {i + 1: f"127.0.0.1:{p}" for i, p in enumerate(ports)}
        self.tmp = tmp
        self.settings = RaftSettings(**{"password": "quorum-test-secret", **settings})
        self.targets = {i: ListTarget() for i in self.addrs}
        self.members: dict[int, Member] = {}

    def start(self, nid: int, **overrides: Any) -> Member:
        q = Member(
            nid,
            self.addrs[nid],
            {i: a for i, a in self.addrs.items() if i != nid},
            self.tmp / f"n{nid}",
            self.targets[nid],
            dataclasses.replace(self.settings, **overrides),
        )
        self.members[nid] = q
        return q

    def stop(self, nid: int) -> None:
        self.members.pop(nid).close()

    def close(self) -> None:
        for nid in list(self.members):
            self.stop(nid)

    async def leader(self, timeout: float = 10.0) -> Member:
        with trio.fail_after(timeout):
            while True:
                leaders = [q for q in self.members.values() if q.is_leader]
                if len(leaders) == 1:
                    lid = leaders[0].node_id
                    if all(q.leader_id == lid for q in self.members.values()):
                        return leaders[0]
                await trio.sleep(0.02)


async def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    with trio.move_on_after(timeout):
        while not cond():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"timed out waiting for {what}")


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@trio_test
async def test_three_members_group_commit_failover_restart(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, fsync="always")
    capture = _Capture()
    logging.getLogger("pysyncobj").addHandler(capture)
    try:
        for nid in cluster.addrs:
            cluster.start(nid)
        events = {nid: q.leadership_events() for nid, q in cluster.members.items()}
        for nid, q in cluster.members.items():
            cluster.targets[nid].sync_probe = lambda q=q: q.quorum.stats()[
                "journal_synced_index"
            ]  # on q's own thread
        leader = await cluster.leader()
        assert sum(q.is_leader for q in cluster.members.values()) == 1
        # the leader saw (True, term) on its event channel
        with trio.fail_after(5):
            while True:
                is_leader, term = await events[leader.node_id].receive()
                if is_leader:
                    assert term == leader.term
                    break

        # submit on a follower: NOT_CONTROLLER, nothing forwarded
        follower = next(q for q in cluster.members.values() if not q.is_leader)
        with pytest.raises(KraftError) as ei:
            await follower.submit(b"nope", timeout=2)
        assert ei.value.code == ErrorCode.NOT_CONTROLLER

        # 32 concurrent submitters, 8 commands each
        syncs_before = leader.stats()["journal_syncs"]
        results: dict[bytes, Any] = {}

        async def submitter(w: int) -> None:
            for i in range(8):
                cmd = f"w{w}-{i}".encode()
                results[cmd] = await leader.submit(cmd, timeout=10)

        async with trio.open_nursery() as nursery:
            for w in range(32):
                nursery.start_soon(submitter, w)
        assert len(results) == 256
        stats = leader.stats()
        assert stats["commands_sent"] >= 256
        assert stats["groups_sent"] < stats["commands_sent"], stats  # group commit happened
        assert stats["largest_group"] > 1
        # fsync=always: one or more syncs per acknowledged group, each before the ack
        assert stats["journal_syncs"] - syncs_before >= 1
        leader_target = cluster.targets[leader.node_id]
        n_entries = len(leader_target.entries)
        assert n_entries < 256
        # results name distinct positions in the applied order
        assert sorted(pos for _, pos in results.values()) == list(
            range(len(leader_target.commands))
        )

        # followers apply the same commands in the same order, in the same entries
        await wait_for(
            lambda: all(
                len(t.snapshot()) == len(leader_target.snapshot()) for t in cluster.targets.values()
            ),
            10,
            "followers to apply",
        )
        for t in cluster.targets.values():
            assert t.snapshot() == leader_target.snapshot()
            assert t.entries == leader_target.entries
            assert t.unsynced_at_apply == [], "an entry was applied before it was on disk"
        for q in cluster.members.values():
            assert q.stats()["journal_syncs"] > 0
        # late acks do not make the leader re-send (and followers truncate) applied entries
        assert not [m for m in capture.messages if "already-applied" in m], capture.messages

        # the leader goes away: a new one within a few seconds; submissions continue
        old_id = leader.node_id
        t0 = time.monotonic()
        cluster.stop(old_id)
        new_leader = await cluster.leader(timeout=6)
        failover = time.monotonic() - t0
        assert new_leader.node_id != old_id and failover < 5, failover
        with trio.fail_after(10):
            while True:  # the first submit may race the election's no-op / a step-down
                try:
                    await new_leader.submit(b"after-failover", timeout=3)
                    break
                except KraftError:
                    await trio.sleep(0.05)
        assert cluster.targets[new_leader.node_id].snapshot()[-1] == b"after-failover"

        # restart the old leader from its journal: its target keeps its state (its own log),
        # PySyncObj re-applies the journal, entries <= last applied are skipped
        before = cluster.targets[old_id].snapshot()
        restarted = cluster.start(old_id)
        await wait_for(
            lambda: cluster.targets[old_id].snapshot()[-1:] == [b"after-failover"],
            10,
            "the restarted member to catch up",
        )
        after = cluster.targets[old_id].snapshot()
        assert after == before + [b"after-failover"]  # nothing applied twice
        assert restarted.stats()["entries_skipped"] >= n_entries
        assert restarted.status()["leader_id"] == new_leader.node_id
        status = new_leader.status()
        assert status["state"] == "leader" and status["has_quorum"]
        assert set(status["voters"]) == {1, 2, 3}
    finally:
        logging.getLogger("pysyncobj").removeHandler(capture)
        cluster.close()


@trio_test
async def test_compaction_dump_brings_a_fresh_member_up(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, fsync="never", compaction_min_entries=100_000)
    try:
        cluster.start(1)
        cluster.start(2)
        leader = await cluster.leader()
        for i in range(30):
            await leader.submit(f"a{i}".encode(), timeout=10)
        other = next(q for q in cluster.members.values() if q is not leader)
        await wait_for(lambda: len(cluster.targets[other.node_id].snapshot()) == 30, 10, "apply")
        for q in cluster.members.values():
            q.force_compaction()
        await wait_for(
            lambda: all(q.stats()["dumps_written"] >= 1 for q in cluster.members.values()),
            10,
            "compaction",
        )
        assert (tmp_path / f"n{leader.node_id}" / "dump.bin").exists()
        await leader.submit(b"after-dump", timeout=10)

        fresh = cluster.start(3)  # empty directory: must be installed from the leader's dump
        target3 = cluster.targets[3]
        await wait_for(
            lambda: target3.snapshot() == cluster.targets[leader.node_id].snapshot(),
            15,
            "the fresh member to catch up",
        )
        assert target3.loads == 1 and fresh.stats()["dumps_loaded"] == 1
        # it applied only what followed the dump
        assert [n for _, _, n in target3.entries] == [1] * len(target3.entries)
        assert len(target3.entries) < 31
        await leader.submit(b"later", timeout=10)
        await wait_for(lambda: target3.snapshot()[-1:] == [b"later"], 10, "replication to 3")

        # a member restarting from dump + journal with its state already ahead of the dump
        # does not load the dump again nor re-apply anything
        other_id = other.node_id
        await wait_for(lambda: cluster.targets[other_id].snapshot()[-1:] == [b"later"], 10, "apply")
        before = cluster.targets[other_id].snapshot()
        cluster.stop(other_id)
        restarted = cluster.start(other_id)
        await leader.submit(b"last", timeout=10)
        await wait_for(lambda: cluster.targets[other_id].snapshot()[-1:] == [b"last"], 10, "apply")
        assert cluster.targets[other_id].snapshot() == before + [b"last"]
        assert cluster.targets[other_id].loads == 0 and restarted.stats()["dumps_loaded"] == 0
    finally:
        cluster.close()


@trio_test
async def test_isolated_leader_steps_down_and_close_fails_waiters(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, fsync="never", leader_fallback_timeout=1.5)
    try:
        for nid in cluster.addrs:
            cluster.start(nid)
        leader = await cluster.leader()
        events = leader.leadership_events()
        assert await events.receive() == (True, leader.term)
        for nid in [n for n in cluster.members if n != leader.node_id]:
            cluster.stop(nid)
        # no majority: a submission cannot commit; the leader falls back to follower
        outcome: list[Any] = []

        async def lonely() -> None:
            try:
                outcome.append(await leader.submit(b"lonely", timeout=30))
            except KraftError as err:
                outcome.append(err)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(lonely)
            t0 = time.monotonic()
            with trio.fail_after(5):
                assert (await events.receive())[0] is False
            assert time.monotonic() - t0 < 3
            assert not leader.is_leader and not leader.status()["has_quorum"]
            with pytest.raises(KraftError) as ei:
                await leader.submit(b"x", timeout=1)
            assert ei.value.code == ErrorCode.NOT_CONTROLLER
            assert outcome == []  # still waiting: the entry may yet commit under a new leader
            cluster.stop(leader.node_id)  # close: the in-flight group fails, outcome unknown
        assert isinstance(outcome[0], KraftError)
        assert outcome[0].code == ErrorCode.REQUEST_TIMED_OUT
    finally:
        cluster.close()


def test_refuses_to_run_without_password_loopback_included(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="password"):
        RaftQuorum(1, "10.1.2.3:9000", {2: "10.1.2.4:9000"}, tmp_path, ListTarget(), RaftSettings())
    with pytest.raises(ValueError, match="password"):
        RaftQuorum(1, "0.0.0.0:9000", {}, tmp_path, ListTarget(), RaftSettings())
    with pytest.raises(ValueError, match="loopback included"):
        RaftQuorum(1, "127.0.0.1:9000", {}, tmp_path, ListTarget(), RaftSettings())
    RaftQuorum(
        1,
        "10.1.2.3:9000",
        {2: "10.1.2.4:9000"},
        tmp_path,
        ListTarget(),
        RaftSettings(password="s3cret"),
    )  # constructing is fine; not started
    with pytest.raises(ValueError):
        RaftSettings(fsync="sometimes").validate()


@trio_test
async def test_group_committer_batches_while_in_flight() -> None:
    sent: list[list[bytes]] = []
    completions: list[Callable[..., None]] = []

    def send(commands: list[bytes], complete: Callable[..., None]) -> None:
        sent.append(commands)
        completions.append(complete)

    gc = GroupCommitter(send, max_commands=3, max_bytes=100)
    results: dict[bytes, Any] = {}

    async def one(c: bytes, committer: GroupCommitter = gc) -> None:
        try:
            results[c] = await committer.submit(c, timeout=5)
        except KraftError as err:
            results[c] = err

    async with trio.open_nursery() as nursery:
        for i in range(7):
            nursery.start_soon(one, f"c{i}".encode())
        await wait_for(lambda: len(sent) == 1, 2, "first group")
        assert len(sent[0]) == 1 and gc.queued == 6  # the rest waits for the one in flight
        while len(completions) > 0:
            complete = completions.pop(0)
            complete([c.upper() for c in sent[len(sent) - 1]], None)
            await trio.sleep(0)
    assert [len(g) for g in sent] == [1, 3, 3]
    assert all(results[c] == c.upper() for c in results) and len(results) == 7

    # a timeout before sending drops the command; an error fails the whole group
    gc2 = GroupCommitter(send, max_commands=10)
    sent.clear()
    completions.clear()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, b"x", gc2)
        await wait_for(lambda: len(sent) == 1, 2, "x sent")
        with pytest.raises(KraftError) as ei:
            await gc2.submit(b"late", timeout=0.05)
        assert ei.value.code == ErrorCode.REQUEST_TIMED_OUT
        assert gc2.queued == 1  # abandoned, dropped on the next pump
        completions.pop(0)(None, KraftError(ErrorCode.NOT_CONTROLLER, "lost"))
    assert [len(g) for g in sent] == [1]
    assert isinstance(results[b"x"], KraftError) and results[b"x"].code == ErrorCode.NOT_CONTROLLER
    assert gc2.queued == 0 and gc2.in_flight == 0


def test_group_committer_times_out_waiters_by_their_own_deadlines() -> None:
    """Each submitter times out at its own deadline (a later submitter with a shorter timeout
    first), also while its group is in flight; the others in the group still get their
    results, and a cancelled submitter leaves the rest alone."""
    sent: list[list[bytes]] = []
    completions: list[Callable[..., None]] = []

    def send(commands: list[bytes], complete: Callable[..., None]) -> None:
        sent.append(commands)
        completions.append(complete)

    async def main() -> None:
        gc = GroupCommitter(send, max_commands=10)
        outcome: dict[bytes, Any] = {}

        async def one(c: bytes, timeout: float) -> None:
            started = trio.current_time()
            try:
                outcome[c] = await gc.submit(c, timeout=timeout)
            except KraftError as err:
                outcome[c] = (err.code, round(trio.current_time() - started, 3))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, b"first", 10.0)
            await wait_for(lambda: len(sent) == 1, 2, "first sent")
            nursery.start_soon(one, b"slow", 10.0)
            nursery.start_soon(one, b"quick", 1.0)
            nursery.start_soon(one, b"unused", 10.0)
            await wait_for(lambda: gc.queued == 3, 2, "three queued")
            completions.pop(0)([b"F"], None)
            await wait_for(lambda: len(sent) == 2, 2, "the second group")
            assert sorted(sent[1]) == [b"quick", b"slow", b"unused"]
            await trio.sleep(1.5)  # quick times out while its group is in flight
            assert outcome[b"quick"] == (ErrorCode.REQUEST_TIMED_OUT, 1.0)
            assert b"slow" not in outcome
            completions.pop(0)([c.upper() for c in sent[1]], None)
            await wait_for(lambda: b"slow" in outcome and b"unused" in outcome, 2, "answers")

            with trio.move_on_after(0.5) as scope:  # a submitter cancelled while in flight
                await gc.submit(b"gone", timeout=10.0)
            assert scope.cancelled_caught and sent[-1] == [b"gone"]
            nursery.start_soon(one, b"after", 10.0)
            await wait_for(lambda: gc.queued == 1, 2, "after queued")
            completions.pop(0)([b"GONE"], None)  # nobody waits for it: ignored
            await wait_for(lambda: len(sent) == 4, 2, "after sent")
            completions.pop(0)([b"AFTER"], None)
        assert outcome[b"first"] == b"F" and outcome[b"slow"] == b"SLOW"
        assert outcome[b"unused"] == b"UNUSED" and outcome[b"after"] == b"AFTER"
        assert gc.queued == 0 and gc.in_flight == 0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_group_committer_waits_briefly_for_the_writers_it_just_answered() -> None:
    """After a group completes, the next one waits (at most fill_wait) until it holds as many
    commands as were queued plus the ones just answered; a sequential writer never waits."""
    sent: list[tuple[float, list[bytes]]] = []
    completions: list[Callable[..., None]] = []

    def send(commands: list[bytes], complete: Callable[..., None]) -> None:
        sent.append((trio.current_time(), commands))
        completions.append(complete)

    async def main() -> None:
        gc = GroupCommitter(send, max_commands=10, fill_wait=0.05)

        async def one(c: bytes) -> None:
            await gc.submit(c, timeout=5)

        def finish() -> None:
            completions.pop()(list(sent[-1][1]), None)  # one group in flight: the last sent

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, b"c0")
            await wait_for(lambda: len(sent) == 1, 2, "c0 sent at once")
            for c in (b"c1", b"c2", b"c3"):
                nursery.start_soon(one, c)
            await wait_for(lambda: gc.queued == 3, 2, "three queued")
            finish()  # 3 queued + 1 answered: the next group waits for a fourth
            await trio.sleep(0.01)
            assert len(sent) == 1 and gc.fill_waits >= 1
            t = trio.current_time()
            nursery.start_soon(one, b"c4")
            await wait_for(lambda: len(sent) == 2, 2, "the filled group")
            assert sorted(sent[1][1]) == [b"c1", b"c2", b"c3", b"c4"] and sent[1][0] - t < 0.01
            finish()  # 4 answered: the next group waits for them, but only fill_wait
            t = trio.current_time()
            nursery.start_soon(one, b"c5")
            await wait_for(lambda: len(sent) == 3, 2, "c5 after fill_wait")
            assert sent[2][1] == [b"c5"] and 0.04 <= sent[2][0] - t <= 0.06
            finish()  # one answered, nothing queued: a sequential writer is sent at once
            t = trio.current_time()
            nursery.start_soon(one, b"c6")
            await wait_for(lambda: len(sent) == 4, 2, "c6 at once")
            assert sent[3][0] - t < 0.01
            finish()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_the_quorum_patches_keep_socket_inet_ntop_working():
    """PySyncObj replaces socket.inet_ntop with a Windows-only function on import; the patches
    applied at start-up (RaftQuorum.start, kraft.controller_server.main) put the C one back."""
    import socket

    import kraft.quorum.raft  # noqa: F401  (imported for its side effects)
    from kraft.quorum import pysyncobj_patches

    pysyncobj_patches.apply()
    assert socket.inet_ntop(socket.AF_INET, b"\x7f\x00\x00\x01") == "127.0.0.1"
    assert socket.inet_ntop(socket.AF_INET6, bytes(15) + b"\x01") == "::1"


def test_the_patches_repair_inet_ntop_even_when_pysyncobj_was_imported_first():
    """Patches are applied explicitly at start-up (pysyncobj_patches.apply), not on import."""
    import subprocess
    import sys

    code = (
        "import socket, pysyncobj.syncobj, kraft.quorum.raft; "
        "from kraft.quorum import pysyncobj_patches; pysyncobj_patches.apply(); "
        "print(socket.inet_ntop(socket.AF_INET, b'\\x7f\\x00\\x00\\x01'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0 and out.stdout.strip() == "127.0.0.1", out.stderr


@trio_test
async def test_a_peer_announcing_a_huge_raft_frame_is_cut_off(tmp_path: Path) -> None:
    """PySyncObj would buffer an announced 2 GiB frame before rejecting it (even with a
    password); the quorum closes such a connection at once and keeps working."""
    import struct

    (port,) = pick_free_ports(1)
    q = Member(
        1,
        f"127.0.0.1:{port}",
        {},
        tmp_path,
        ListTarget(),
        RaftSettings(password="s3cret", fsync="never"),
    )
    try:
        await wait_for(lambda: q.is_leader, 10, "single member to lead")
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(struct.pack("i", 2**31 - 1))
        junk = os.urandom(1 << 16)
        sent = 0
        closed = False
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sent < 512 << 20:
            try:
                sock.sendall(junk)
                sent += len(junk)
            except OSError:  # reset: the member closed us
                closed = True
                break
            await trio.sleep(0)
        sock.close()
        assert closed and sent < 64 << 20, sent
        assert await q.submit(b"still-works", timeout=5) is not None
    finally:
        q.close()


@trio_test
async def test_encrypted_members_replicate_bare_and_compressed_messages(tmp_path: Path) -> None:
    """Messages under COMPRESS_MIN_BYTES travel as the bare pickle, larger ones zlib-compressed;
    with a password both are encrypted, and every member applies the same commands."""
    from kraft.quorum.raft import COMPRESS_MIN_BYTES

    cluster = Cluster(tmp_path, password="s3cret", fsync="never")
    try:
        for nid in cluster.addrs:
            cluster.start(nid)
        leader = await cluster.leader()
        big = os.urandom(COMPRESS_MIN_BYTES // 2) * 3  # compressible, over the threshold
        sent = [b"small-1", big, b"small-2"]
        for command in sent:
            await leader.submit(command, timeout=10)
        await wait_for(
            lambda: all(t.commands[-3:] == sent for t in cluster.targets.values()),
            10,
            "every member to apply the three commands",
        )
    finally:
        cluster.close()


class SlowTarget(ListTarget):
    """Applies every entry in ``delay`` seconds (blocking the member's thread, like a big apply)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def apply_entry(self, raft_index: int, term: int, commands: list[bytes]) -> list[Any]:
        time.sleep(self.delay)
        return super().apply_entry(raft_index, term, commands)


@trio_test
async def test_long_applies_on_the_leader_do_not_cost_an_election(tmp_path: Path) -> None:
    """Eight entries committed together, applied 0.25 s each on the leader's thread (2 s
    in one tick, twice the largest election timeout): the leader keeps sending heartbeats
    between them, so no follower starts an election."""
    cluster = Cluster(tmp_path, fsync="never", group_max_commands=1, group_max_in_flight=8)
    cluster.targets = {i: SlowTarget(0.0) for i in cluster.addrs}
    try:
        for nid in cluster.addrs:
            cluster.start(nid)
        leader = await cluster.leader()
        term = leader.term
        cluster.targets[leader.node_id].delay = 0.25  # type: ignore[attr-defined]  # a test target's extra knob
        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(functools.partial(leader.submit, b"slow-%d" % i, timeout=30))
        await wait_for(
            lambda: all(len(t.commands) == 8 for t in cluster.targets.values()),
            30,
            "every member to apply the eight commands",
        )
        assert leader.is_leader and leader.term == term
        assert all(q.term == term for q in cluster.members.values())
    finally:
        cluster.close()


@trio_test
async def test_a_follower_cut_off_from_the_leader_does_not_depose_it(tmp_path: Path) -> None:
    """A follower that stops receiving the leader's appends (dropped on arrival: one-way link
    loss, or a member too starved to read them) times out and asks for pre-votes; the others
    still hear from the leader and refuse, so no member changes term. When the appends flow
    again it simply follows. (Stock PySyncObj would start an election and depose the leader.)

    Election timeouts of 2-3 s: the member that still hears the leader must not miss its
    heartbeats for a whole timeout, which a loaded test machine did with 0.4 s (it then
    rightly granted the pre-vote)."""
    cluster = Cluster(tmp_path, fsync="never", raft_min_timeout=2.0, raft_max_timeout=3.0)
    try:
        for nid in cluster.addrs:
            cluster.start(nid)
        leader = await cluster.leader()
        term = leader.term
        follower = next(q for q in cluster.members.values() if q is not leader)
        others = [q for q in cluster.members.values() if q is not follower]
        dropping = threading.Event()
        dropping.set()

        def cut_off() -> None:
            transport = follower.quorum._so._SyncObj__transport  # type: ignore[union-attr]  # a started member
            passing = transport._on_message

            def filtered(node: Any, message: Any, deliver: Callable[[Any, Any], None]) -> None:
                if dropping.is_set() and message.get("type") == "append_entries":
                    return
                passing(node, message, deliver)

            transport._on_message = filtered

        follower.call(cut_off)
        await wait_for(
            lambda: sum(q.stats()["pre_votes_refused"] for q in others) >= 2,
            30,
            "the cut-off follower's pre-votes to be refused by both others",
        )
        dropping.clear()
        await leader.submit(b"after", timeout=10)
        await wait_for(
            lambda: b"after" in cluster.targets[follower.node_id].snapshot(),
            15,
            "the follower to apply a new entry",
        )
        assert follower.stats()["pre_vote_rounds"] >= 1
        assert leader.is_leader
        assert [q.term for q in cluster.members.values()] == [term] * 3
    finally:
        cluster.close()


@trio_test
async def test_a_quorum_mixing_members_with_and_without_pre_vote_elects(tmp_path: Path) -> None:
    """Member 3 runs stock PySyncObj elections (no pre-vote), 1 and 2 pre-vote. With only 1 and
    3 up, 1's pre-vote requests go unanswered (3 ignores the unknown type), so 3 must win by a
    real election that 1 grants; after 3 is stopped, 1 and 2 elect each other by pre-vote."""
    cluster = Cluster(tmp_path, fsync="never")
    try:
        cluster.start(1)
        cluster.start(3, prevote=False)
        first = await cluster.leader(timeout=20)
        assert first.node_id == 3
        first_term = first.term
        await first.submit(b"mixed-1", timeout=10)
        cluster.start(2)
        await wait_for(
            lambda: b"mixed-1" in cluster.targets[2].snapshot(), 15, "member 2 to catch up"
        )
        cluster.stop(3)
        second = await cluster.leader(timeout=20)
        assert second.node_id in (1, 2) and second.term > first_term
        await second.submit(b"mixed-2", timeout=10)
        cluster.start(3, prevote=False)
        await wait_for(
            lambda: b"mixed-2" in cluster.targets[3].snapshot(), 15, "member 3 to catch up"
        )
        assert cluster.targets[1].snapshot() == cluster.targets[3].snapshot()
    finally:
        cluster.close()


@trio_test
async def test_a_follower_stuck_in_a_higher_term_is_brought_back(tmp_path: Path) -> None:
    """A follower in a term above the leader's (as after winning a pre-vote and then losing the
    election to stickiness) ignores the leader's lower-term appends and its own pre-votes are
    refused while the leader is live; the leader, asked for a pre-vote by a member in a higher
    term, steps down to it, so a new election brings the follower back instead of leaving it
    out for good."""
    cluster = Cluster(tmp_path, fsync="never")
    try:
        for nid in cluster.addrs:
            cluster.start(nid)
        leader = await cluster.leader()
        term = leader.term
        follower = next(q for q in cluster.members.values() if q is not leader)

        def bump() -> None:
            so = follower.quorum._so
            assert so is not None
            so._SyncObj__setCurrentTerm(term + 5, None)

        follower.call(bump)
        await wait_for(
            lambda: any(q.is_leader and q.term > term + 5 for q in cluster.members.values()),
            20,
            "a leader in a term above the stuck follower's",
        )
        new_leader = await cluster.leader(timeout=20)
        assert new_leader.term > term + 5
        await new_leader.submit(b"back", timeout=10)
        await wait_for(
            lambda: b"back" in cluster.targets[follower.node_id].snapshot(),
            15,
            "the formerly stuck follower to apply a new entry",
        )
    finally:
        cluster.close()


@trio_test
async def test_a_leadership_transfer_passes_stickiness(tmp_path: Path) -> None:
    """PySyncObj's leadership transfer (timeout_now; pykraft does not use it) skips pre-vote: a
    pre-vote would be refused, as the others still hear from the old leader. Its vote requests
    are flagged past stickiness (with three members the old leader's vote alone suffices)."""
    cluster = Cluster(tmp_path, fsync="never")
    try:
        for nid in cluster.addrs:
            cluster.start(nid)
        leader = await cluster.leader()
        term = leader.term
        await leader.submit(b"before-transfer", timeout=10)
        target = next(q for q in cluster.members.values() if q is not leader)
        answers: list[Any] = []

        def transfer() -> None:
            so = leader.quorum._so
            assert so is not None
            so.transferLeadership(cluster.addrs[target.node_id], lambda r, e: answers.append(e))

        def transferred() -> bool:  # denied while the target's log is behind the leader's
            answers.clear()
            leader.call(transfer)
            assert answers in ([FAIL_REASON.SUCCESS], [FAIL_REASON.REQUEST_DENIED]), answers
            return answers == [FAIL_REASON.SUCCESS]

        await wait_for(transferred, 20, "the transfer to be accepted (target in sync)")
        await wait_for(lambda: target.is_leader, 20, "the transfer target to lead")
        assert target.term > term
        await target.submit(b"after-transfer", timeout=10)
    finally:
        cluster.close()


@trio_test
async def test_followers_campaign_at_once_when_the_leaders_connections_close(
    tmp_path: Path,
) -> None:
    """A leader that stops (its sockets closed, as when its process is killed with -9): the
    followers see their connections to it close and campaign within a quarter of the minimum
    election timeout (3 s here) instead of waiting out a whole timeout, so a new leader is
    there before any follower's own timer could have run out; one election, no split vote."""
    cluster = Cluster(tmp_path, fsync="never", raft_min_timeout=3.0, raft_max_timeout=6.0)
    try:
        for nid in cluster.addrs:
            cluster.start(nid)
        leader = await cluster.leader(timeout=30)
        term = leader.term
        await leader.submit(b"before", timeout=10)
        stopped = time.monotonic()
        cluster.stop(leader.node_id)
        successor = await cluster.leader(timeout=30)
        elapsed = time.monotonic() - stopped
        assert elapsed < 2.9, f"the new leader took {elapsed:.2f} s: a timeout, not the close"
        assert successor.term == term + 1
        assert sum(q.stats()["leader_disconnects"] for q in cluster.members.values()) >= 1
        await successor.submit(b"after", timeout=10)
    finally:
        cluster.close()


@trio_test
async def test_commands_are_replicated_in_the_order_they_were_queued() -> None:
    """``enqueue`` queues at once, without yielding; tasks that wait for the outcomes later,
    in any order, do not change the order the commands are sent in (the controller's
    pipelined transition steps chain on each other and must reach Raft as proposed)."""
    sent: list[bytes] = []

    def send(commands: list[bytes], complete: Any) -> None:
        sent.extend(commands)
        complete([c.upper() for c in commands], None)

    gc = GroupCommitter(send, max_commands=1)
    waiters = [(c, gc.enqueue(c, 5)) for c in (b"a", b"b", b"c", b"d")]
    results: dict[bytes, Any] = {}

    async def wait(c: bytes, w: Any) -> None:
        results[c] = await gc.wait(w, 5)

    async with trio.open_nursery() as nursery:
        for c, w in reversed(waiters):  # waited for last-first
            nursery.start_soon(wait, c, w)
    assert sent == [b"a", b"b", b"c", b"d"]
    assert results == {b"a": b"A", b"b": b"B", b"c": b"C", b"d": b"D"}
