"""The broker image check's decisions (kraft.metadata.image_check): when to ask, which stated
checksum to compare, reload on a first mismatch, fence on a second, clear on agreement; and
the active controller's tracking of the brokers that report a divergence."""

from __future__ import annotations

from kraft.metadata.image_check import (
    Action,
    BrokerImageTracker,
    ImageCheck,
    Mismatch,
    Stated,
    TrackerEvent,
    can_state,
    reached_offset,
)
from kraft.rpc.bodies import BrokerHeartbeatRequest, FetchMetadataRequest, decode_request
from tools.commands.cluster_cmd import render_describe

GOOD, BAD = "a" * 64, "b" * 64


def test_due_at_once_then_every_interval_and_never_when_disabled() -> None:
    check = ImageCheck(1000)
    assert check.due(0)
    check.judge(Stated(5, GOOD, 1), GOOD, now_ms=100)
    assert not check.due(1099)
    assert check.due(1100)
    off = ImageCheck(0)
    assert not off.enabled and not off.due(0) and not off.due(10**9)
    off.stated(Stated(5, GOOD, 1))
    assert off.take(5) is None  # a disabled check ignores what an answer states


def test_a_stated_checksum_is_compared_only_at_its_offset_and_only_once() -> None:
    check = ImageCheck(1000)
    check.stated(Stated(7, GOOD, 2))
    assert check.take(6) is None  # the image did not stop at 7: dropped
    assert check.take(7) is None
    check.stated(Stated(7, GOOD, 2))
    assert check.take(7) == Stated(7, GOOD, 2)
    assert check.take(7) is None
    assert check.due(10**6)  # nothing compared yet: the next fetch asks again


def test_first_mismatch_reloads_second_fences_agreement_recovers() -> None:
    check = ImageCheck(1000)
    assert check.judge(Stated(10, GOOD, 1), GOOD, 0) is Action.AGREE
    assert check.mismatch is None and not check.fenced

    assert check.judge(Stated(11, GOOD, 1), BAD, 1000) is Action.RELOAD
    assert check.mismatch == Mismatch(11, BAD, GOOD, 1, fenced=False)
    assert not check.fenced

    assert check.judge(Stated(12, GOOD, 3), BAD, 2000) is Action.FENCE
    assert check.mismatch == Mismatch(12, BAD, GOOD, 3, fenced=True)
    assert check.fenced

    assert check.judge(Stated(13, GOOD, 1), BAD, 3000) is Action.STAY_FENCED
    assert check.fenced

    assert check.judge(Stated(14, GOOD, 1), GOOD, 4000) is Action.RECOVERED
    assert check.mismatch is None and not check.fenced
    assert (check.checks, check.mismatches) == (5, 3)


def test_a_reload_that_repairs_the_image_recovers_without_fencing() -> None:
    check = ImageCheck(1000)
    assert check.judge(Stated(11, GOOD, 1), BAD, 0) is Action.RELOAD
    assert check.judge(Stated(11, GOOD, 1), GOOD, 1000) is Action.RECOVERED
    # a later, unrelated fault starts over with a reload
    assert check.judge(Stated(20, GOOD, 1), BAD, 2000) is Action.RELOAD


def test_a_controller_states_its_checksum_only_where_the_fetcher_will_be() -> None:
    assert reached_offset(10, 14) == 14  # batches 10..14
    assert reached_offset(15, None) == 14  # none: an idle fetcher is already at 14
    assert can_state(14, 15, 14)
    assert not can_state(14, 15, 12)  # the answer was cut short (max_bytes)
    assert not can_state(13, 15, 14)  # the image lags the log (never between entries, but)
    assert not can_state(14, 15, 15)  # the fetcher is ahead of this controller
    assert not can_state(-1, 0, -1)  # nothing to state on an empty log


def test_the_tracker_reports_each_change_once() -> None:
    tracker = BrokerImageTracker()
    diverged = Mismatch(11, BAD, GOOD, 1, fenced=False)
    fenced = Mismatch(12, BAD, GOOD, 1, fenced=True)
    assert tracker.note(101, None) is None
    assert tracker.note(101, diverged) is TrackerEvent.DIVERGED
    assert tracker.note(101, diverged) is None  # every heartbeat repeats it: logged once
    assert tracker.note(101, fenced) is TrackerEvent.FENCED
    assert tracker.note(101, fenced) is None
    assert tracker.note(102, fenced) is TrackerEvent.FENCED  # first heard of already fenced
    assert sorted(tracker.divergent) == [101, 102]
    assert tracker.note(101, None) is TrackerEvent.CLEARED
    assert tracker.note(101, None) is None
    tracker.forget(102)
    assert tracker.divergent == {}
    tracker.note(103, diverged)
    tracker.forget_all()
    assert tracker.divergent == {}


def test_the_new_request_fields_are_optional_and_checked() -> None:
    fetch = decode_request("FetchMetadata", {"from_offset": 3})
    assert isinstance(fetch, FetchMetadataRequest) and fetch.image_checksum is None
    base = {
        "broker_id": 101,
        "broker_epoch": 5,
        "metadata_offset": 9,
        "want_fence": False,
        "want_shutdown": False,
    }
    hb = decode_request("BrokerHeartbeat", base)  # an older broker's heartbeat
    assert isinstance(hb, BrokerHeartbeatRequest) and hb.image_mismatch is None
    mismatch = {
        "offset": 9,
        "checksum": BAD,
        "controller_checksum": GOOD,
        "controller_id": 1,
        "fenced": True,
    }
    hb = decode_request("BrokerHeartbeat", {**base, "image_mismatch": mismatch})
    assert isinstance(hb, BrokerHeartbeatRequest)
    assert hb.image_mismatch is not None and hb.image_mismatch.fenced


def test_cluster_describe_names_a_divergent_broker() -> None:
    broker = {
        "broker_id": 101,
        "epoch": 3,
        "rack": None,
        "state": "fenced",
        "listeners": [],
    }
    mismatch = {"offset": 42, "checksum": BAD, "controller_checksum": GOOD, "fenced": True}
    clean = render_describe({"cluster_id": "c", "controller_id": 1, "brokers": [broker]})
    assert "differs" not in clean
    text = render_describe(
        {
            "cluster_id": "c",
            "controller_id": 1,
            "brokers": [{**broker, "image_mismatch": mismatch}],
            "divergent_brokers": [101],
        }
    )
    assert "Broker 101: metadata image differs from the controllers' at offset 42" in text
    assert "asks to be fenced" in text
