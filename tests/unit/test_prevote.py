"""The pre-vote and stickiness decisions (kraft.quorum.prevote), as pure functions."""

from __future__ import annotations

import pytest

from kraft.quorum.prevote import grant_pre_vote, log_up_to_date, majority_contact_age, sticky

MIN = 0.4


def grant(**over: object) -> bool:
    args: dict[str, object] = {
        "proposed_term": 6,
        "candidate_last_term": 5,
        "candidate_last_index": 100,
        "current_term": 5,
        "last_term": 5,
        "last_index": 100,
        "since_leader_contact": None,
        "min_election_timeout": MIN,
    }
    args.update(over)
    return grant_pre_vote(**args)  # type: ignore[arg-type]  # the test's keyword overrides


def test_grants_an_up_to_date_candidate_when_no_leader_was_heard():
    assert grant()
    assert grant(since_leader_contact=MIN)  # exactly the minimum: the leader is overdue
    assert grant(since_leader_contact=5.0)


def test_refuses_while_a_live_leader_was_heard_within_the_minimum_timeout():
    assert not grant(since_leader_contact=0.0)
    assert not grant(since_leader_contact=MIN - 0.001)


def test_refuses_a_proposed_term_not_above_ours():
    assert not grant(current_term=6)
    assert not grant(current_term=7)


@pytest.mark.parametrize(
    ("cand_term", "cand_index", "ok"),
    [(5, 100, True), (5, 101, True), (5, 99, False), (4, 1000, False), (6, 1, True)],
)
def test_log_must_be_at_least_as_up_to_date(cand_term: int, cand_index: int, ok: bool):
    assert log_up_to_date(cand_term, cand_index, 5, 100) is ok
    assert grant(candidate_last_term=cand_term, candidate_last_index=cand_index) is ok


def stick(**over: object) -> bool:
    args: dict[str, object] = {
        "request_term": 6,
        "current_term": 5,
        "is_leader": False,
        "transfer": False,
        "since_leader_contact": 0.05,
        "min_election_timeout": MIN,
    }
    args.update(over)
    return sticky(**args)  # type: ignore[arg-type]  # the test's keyword overrides


def test_a_follower_hearing_a_leader_ignores_a_higher_term_vote_request():
    assert stick()


def test_not_sticky_without_recent_leader_for_transfers_same_terms_or_on_the_leader():
    assert not stick(since_leader_contact=None)
    assert not stick(since_leader_contact=MIN)
    assert not stick(transfer=True)
    assert not stick(request_term=5)
    assert not stick(is_leader=True)


def test_a_leaders_liveness_is_the_age_of_its_majoritys_last_answer():
    # three members: one answer besides its own is a majority -> the most recent answer counts
    assert majority_contact_age(10.0, [9.9, 2.0], 3) == pytest.approx(0.1)
    # five members: two answers needed -> the second most recent
    assert majority_contact_age(10.0, [9.9, 9.0, 1.0, 0.0], 5) == pytest.approx(1.0)
    assert majority_contact_age(10.0, [], 3) is None
    assert majority_contact_age(10.0, [], 1) == 0.0


def test_a_closed_leader_connection_brings_the_deadline_forward_never_back():
    from kraft.quorum.prevote import EARLY_ELECTION_SPREAD, early_deadline

    now = 100.0
    assert early_deadline(100.9, now, MIN, 0.0) == now  # at once
    soonest_late = now + 0.999 * EARLY_ELECTION_SPREAD * MIN
    assert early_deadline(101.0, now, MIN, 0.999) == soonest_late
    assert early_deadline(100.05, now, MIN, 0.9) == 100.05  # already sooner: kept
