"""BrokerHeartbeatManager: sessions with a fake clock, heartbeat transitions (docs/kraft-notes.md)."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from kraft.controller.heartbeats import BrokerHeartbeatManager
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.records import (
    FENCE,
    FENCE_UNCHANGED,
    LEADER_NONE,
    RECOVERED,
    UNFENCE,
    BrokerRegistrationChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)

TIMEOUT = 9000
T = str(uuid.UUID(int=3))
EP = ({"name": "PLAINTEXT", "host": "h", "port": 1, "security_protocol": "PLAINTEXT"},)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


def apply(image, *records):
    delta = MetadataDelta(image)
    for r in records:
        delta.replay(r)
    return delta.apply()


def registered(*ids, fenced=True, epoch_base=10):
    return apply(
        MetadataImage.EMPTY,
        *(
            RegisterBrokerRecord(b, f"inc-{b}", epoch_base + b, EP, (), None, fenced, False)
            for b in ids
        ),
    )


def unfence(image, b):
    return apply(image, BrokerRegistrationChangeRecord(b, image.brokers[b].epoch, UNFENCE, 0))


# ---- sessions ---------------------------------------------------------------------------------


def test_session_expiry_fences_one_at_a_time_oldest_first():
    clock = Clock()
    m = BrokerHeartbeatManager(TIMEOUT)
    image = registered(1, 2, 3, fenced=False)
    for b in (1, 2, 3):
        m.register(b, image.brokers[b].epoch, clock.now, fenced=False)
    clock.advance(1000)
    m.heartbeat(3, 13, 100, False, False, clock.now, image)  # 3 stays in touch
    clock.advance(1000)
    m.heartbeat(1, 11, 100, False, False, clock.now, image)  # 1 later than 2
    assert m.next_expired(clock.now) is None
    clock.now = 1_000_000 + TIMEOUT - 1
    assert m.next_expired(clock.now) is None
    clock.advance(1)  # 2's session (last contact at start) expires first
    assert m.next_expired(clock.now) == 2
    assert m.next_expired(clock.now) is None  # one at a time: 2 is now taken as fenced
    clock.now = 1_001_000 + TIMEOUT
    assert m.next_expired(clock.now) == 3
    clock.now = 1_002_000 + TIMEOUT
    assert m.next_expired(clock.now) == 1
    assert m.next_expired(clock.now + 10**9) is None


def test_fenced_brokers_do_not_expire_and_heartbeats_refresh_knowledge():
    clock = Clock()
    m = BrokerHeartbeatManager(TIMEOUT)
    image = registered(1, fenced=True)
    m.register(1, 11, clock.now)  # fence state unknown: counts as possibly unfenced
    m.heartbeat(1, 11, 0, False, False, clock.now, image)  # now known fenced
    assert m.next_expired(clock.advance(TIMEOUT * 5)) is None
    image = unfence(image, 1)
    m.heartbeat(1, 11, 20, False, False, clock.now, image)  # learns unfenced
    assert m.next_expired(clock.advance(TIMEOUT)) == 1


def test_touch_refreshes_without_state_change():
    clock = Clock()
    m = BrokerHeartbeatManager(TIMEOUT)
    m.register(1, 11, clock.now, fenced=False)
    clock.advance(TIMEOUT - 1)
    m.touch(1, clock.now)
    m.touch(99, clock.now)  # unknown: ignored
    assert m.next_expired(clock.advance(TIMEOUT - 1)) is None
    assert m.has_live_session(1, clock.now)
    assert m.next_expired(clock.advance(1)) == 1
    assert not m.has_live_session(1, clock.now)


def test_reset_all_gives_everyone_a_fresh_session():
    clock = Clock()
    m = BrokerHeartbeatManager(TIMEOUT)
    m.register(1, 11, clock.now, fenced=False)
    m.register(2, 12, clock.now, fenced=False)
    clock.advance(TIMEOUT * 3)
    m.reset_all(clock.now)
    assert m.next_expired(clock.advance(TIMEOUT - 1)) is None
    assert m.next_expired(clock.advance(1)) == 1
    # with an image: exactly the image's brokers, fence state from their registrations
    image = unfence(registered(5, 6, fenced=True), 6)
    m.reset_all(clock.now, image)
    assert not m.has_live_session(1, clock.now) and m.has_live_session(5, clock.now)
    assert m.next_expired(clock.advance(TIMEOUT)) == 6
    assert m.next_expired(clock.now) is None


def test_forget_and_reregistration():
    clock = Clock()
    m = BrokerHeartbeatManager(TIMEOUT)
    m.register(1, 11, clock.now, fenced=False)
    m.forget(1)
    assert m.next_expired(clock.advance(TIMEOUT * 2)) is None
    m.register(1, 11, clock.now, fenced=False)
    m.register(1, 50, clock.advance(100))  # a new epoch is a new session
    assert m.next_expired(clock.advance(TIMEOUT - 50)) is None
    assert m.next_expired(clock.advance(50)) == 1


# ---- heartbeat transitions -------------------------------------------------------------------


def test_unknown_broker_and_stale_epoch():
    m = BrokerHeartbeatManager(TIMEOUT)
    image = registered(1)
    with pytest.raises(KraftError) as e:
        m.heartbeat(2, 12, 0, False, False, 0, image)
    assert e.value.code == ErrorCode.BROKER_ID_NOT_REGISTERED
    with pytest.raises(KraftError) as e:
        m.heartbeat(1, 10, 0, False, False, 0, image)
    assert e.value.code == ErrorCode.STALE_BROKER_EPOCH


def test_caught_up_then_unfence():
    m = BrokerHeartbeatManager(TIMEOUT)
    image = registered(1)  # epoch 11
    d = m.heartbeat(1, 11, 10, False, False, 0, image)
    assert (d.is_caught_up, d.is_fenced, d.should_shut_down, d.command) == (
        False,
        True,
        False,
        None,
    )
    d = m.heartbeat(1, 11, 11, True, False, 0, image)  # caught up but wants to stay fenced
    assert d.is_caught_up and d.command is None
    d = m.heartbeat(1, 11, 11, False, False, 0, image)
    assert d.command == ("UnfenceBroker", {"broker_id": 1, "broker_epoch": 11})
    d = m.heartbeat(1, 11, 12, False, False, 0, unfence(image, 1))
    assert (d.is_fenced, d.command, d.state) == (False, None, "UNFENCED")


def test_fenced_broker_wanting_shutdown_shuts_down_now():
    m = BrokerHeartbeatManager(TIMEOUT)
    d = m.heartbeat(1, 11, 0, False, True, 0, registered(1))
    assert d.should_shut_down and d.command is None and d.state == "SHUTDOWN_NOW"


def test_unfenced_broker_wanting_fence():
    m = BrokerHeartbeatManager(TIMEOUT)
    image = unfence(registered(1), 1)
    d = m.heartbeat(1, 11, 20, True, False, 0, image)
    assert d.command == ("FenceBroker", {"broker_id": 1, "broker_epoch": 11, "reason": "requested"})
    assert not d.should_shut_down and d.state == "FENCED"
    d = m.heartbeat(1, 11, 20, True, True, 0, image)
    assert d.command[0] == "FenceBroker" and d.should_shut_down


def with_partition(image, leader, replicas=(1, 2)):
    return apply(
        image,
        TopicRecord("t", T),
        PartitionRecord(0, T, tuple(replicas), tuple(replicas), (), (), leader, RECOVERED, 0, 0),
    )


def test_shutdown_of_a_broker_leading_nothing_is_immediate():
    m = BrokerHeartbeatManager(TIMEOUT)
    image = with_partition(unfence(unfence(registered(1, 2), 1), 2), leader=2)
    d = m.heartbeat(1, 11, 30, False, True, 0, image)
    assert d.should_shut_down and d.state == "SHUTDOWN_NOW"
    assert d.command == (
        "FenceBroker",
        {"broker_id": 1, "broker_epoch": 11, "reason": "controlled-shutdown"},
    )


def test_a_broker_told_to_shut_down_has_no_live_session():
    """Its next process may register at once (no DUPLICATE_BROKER_REGISTRATION for a session)."""
    m = BrokerHeartbeatManager(TIMEOUT)
    image = with_partition(unfence(unfence(registered(1, 2), 1), 2), leader=2)
    m.heartbeat(1, 11, 30, False, False, 0, image)
    assert m.has_live_session(1, 1)
    assert m.heartbeat(1, 11, 30, False, True, 1, image).should_shut_down
    assert not m.has_live_session(1, 2)
    m.register(1, 40, 3)  # the next process's registration starts a new session
    assert m.has_live_session(1, 4)


def test_controlled_shutdown_completes_when_leaderless_and_others_caught_up():
    clock = Clock()
    m = BrokerHeartbeatManager(TIMEOUT)
    image = with_partition(unfence(unfence(registered(1, 2), 1), 2), leader=1)
    d = m.heartbeat(1, 11, 30, False, True, clock.now, image)
    assert d.command == ("BeginControlledShutdown", {"broker_id": 1, "broker_epoch": 11})
    assert d.state == "CONTROLLED_SHUTDOWN" and not d.should_shut_down
    # the controller writes the shutdown records: broker 1 in controlled shutdown, 2 leads
    delta = MetadataDelta(image)
    delta.replay(BrokerRegistrationChangeRecord(1, 11, FENCE_UNCHANGED, 1))
    delta.replay(PartitionRecord(0, T, (1, 2), (2,), (), (), 2, RECOVERED, 1, 1))
    shutdown_offset = 40
    image = dataclasses.replace(delta.apply(), offset=shutdown_offset)
    m.note_controlled_shutdown_offset(1, shutdown_offset)
    m.heartbeat(2, 12, 39, False, False, clock.now, image)  # broker 2 not there yet
    d = m.heartbeat(1, 11, 40, False, True, clock.now, image)
    assert d.state == "CONTROLLED_SHUTDOWN" and not d.should_shut_down and d.command is None
    m.heartbeat(2, 12, 40, False, False, clock.now, image)  # broker 2 caught up
    assert m.lowest_active_offset(image) == 40
    d = m.heartbeat(1, 11, 40, False, True, clock.now, image)
    assert d.should_shut_down and d.state == "SHUTDOWN_NOW"
    assert d.command == (
        "FenceBroker",
        {"broker_id": 1, "broker_epoch": 11, "reason": "controlled-shutdown"},
    )


def test_controlled_shutdown_waits_while_still_leading_and_want_fence_ends_it():
    m = BrokerHeartbeatManager(TIMEOUT)
    image = with_partition(unfence(unfence(registered(1, 2), 1), 2), leader=1, replicas=(1,))
    image = apply(image, BrokerRegistrationChangeRecord(1, 11, FENCE_UNCHANGED, 1))
    m.note_controlled_shutdown_offset(1, image.offset)
    d = m.heartbeat(1, 11, 50, False, True, 0, image)
    assert d.state == "CONTROLLED_SHUTDOWN" and not d.should_shut_down  # still leads t-0
    # e.g. a failover cut the shutdown's steps short: the active controller continues them
    assert d.command == ("BeginControlledShutdown", {"broker_id": 1, "broker_epoch": 11})
    d = m.heartbeat(1, 11, 50, True, True, 0, image)
    assert d.should_shut_down and d.command[0] == "FenceBroker"
    # once fenced, further heartbeats just say shut down
    image = apply(image, BrokerRegistrationChangeRecord(1, 11, FENCE, 0))
    d = m.heartbeat(1, 11, 50, False, True, 0, image)
    assert d.should_shut_down and d.command is None and d.is_fenced


def test_lowest_active_offset_ignores_fenced_and_shutting_down_brokers():
    m = BrokerHeartbeatManager(TIMEOUT)
    image = unfence(unfence(registered(1, 2, 3), 1), 2)
    m.heartbeat(1, 11, 70, False, False, 0, image)
    m.heartbeat(3, 13, 5, False, False, 0, image)  # fenced: ignored
    assert m.lowest_active_offset(image) == -1  # 2 never heard from
    m.heartbeat(2, 12, 60, False, False, 0, image)
    assert m.lowest_active_offset(image) == 60
    assert m.lowest_active_offset(registered(9)) > 10**15


def test_leads_any_partition_cache_follows_the_image():
    m = BrokerHeartbeatManager(TIMEOUT)
    image = with_partition(unfence(registered(1, 2), 1), leader=1)
    assert m.leads_any_partition(image, 1) and not m.leads_any_partition(image, 2)
    image2 = apply(
        image, PartitionRecord(0, T, (1, 2), (1, 2), (), (), LEADER_NONE, RECOVERED, 1, 1)
    )
    assert not m.leads_any_partition(image2, 1)


def test_a_held_heartbeat_refreshes_the_session_and_notes_the_offset():
    """A heartbeat answered "not yet" while a controlled shutdown is written elsewhere keeps
    the broker alive and records how far it replayed; a stale epoch is left to heartbeat()."""
    clock = Clock()
    image = unfence(registered(1), 1)
    m = BrokerHeartbeatManager(TIMEOUT)
    m.register(1, 11, clock.now, fenced=False)
    at = clock.advance(TIMEOUT - 1)
    held = m.hold(1, 11, 40, at, image)
    assert held is not None and not held.should_shut_down and held.command is None
    assert held.is_caught_up and not held.is_fenced and held.state == "CONTROLLED_SHUTDOWN"
    assert m.metadata_offset(1) == 40
    clock.advance(TIMEOUT - 1)
    assert m.has_live_session(1, clock.now)  # refreshed at ``at``, not at registration
    assert m.hold(1, 11, 5, clock.now, image).is_caught_up is False  # 5 < its epoch 11
    assert m.metadata_offset(1) == 40  # offsets only grow
    assert m.hold(1, 12, 50, clock.now, image) is None  # not its registration
    assert m.hold(2, 11, 50, clock.now, image) is None  # not registered
