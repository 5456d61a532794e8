"""Voters' directory ids: a voter whose directory changed has its votes ignored until caught up."""

from __future__ import annotations

from pathlib import Path

from kraft.quorum.raft import RaftQuorum, RaftSettings
from kraft.storage.voter_directories import VoterDirectories


def test_first_sight_is_recorded_and_survives_a_restart(tmp_path: Path) -> None:
    vd = VoterDirectories(tmp_path)
    assert vd.observe(2, "A" * 22, 10, False, own_applied=10) == "recorded"
    assert vd.observe(2, "A" * 22, 11, False, own_applied=11) is None
    assert VoterDirectories(tmp_path).recorded == {2: "A" * 22}
    assert vd.observe(3, "", 10, False, own_applied=10) is None  # an old node: no id, nothing


def test_a_changed_directory_is_unverified_until_caught_up_and_not_joining(tmp_path: Path) -> None:
    vd = VoterDirectories(tmp_path)
    vd.observe(2, "A" * 22, 10, False, own_applied=10)
    assert vd.observe(2, "B" * 22, -1, True, own_applied=50) == "changed"
    assert vd.unverified == {2: ("B" * 22, 50)}
    assert vd.observe(2, "B" * 22, 49, False, own_applied=60) is None  # not there yet
    assert vd.observe(2, "B" * 22, 55, True, own_applied=60) is None  # still joining
    assert vd.observe(2, "B" * 22, 50, False, own_applied=60) == "verified"
    assert not vd.unverified and VoterDirectories(tmp_path).recorded == {2: "B" * 22}


def test_the_quorum_ignores_vote_messages_from_an_unverified_voter() -> None:
    quorum = RaftQuorum(
        1,
        "127.0.0.1:1",
        {2: "127.0.0.1:2", 3: "127.0.0.1:3"},
        Path("/nonexistent"),
        None,  # type: ignore[arg-type]  # no target: only the vote filter is exercised
        RaftSettings(password="s" * 32),
    )
    grant = {"type": "response_vote", "term": 4}
    request = {"type": "request_vote", "term": 4, "last_log_index": 1, "last_log_term": 0}
    entries = {"type": "append_entries", "term": 4}
    assert not quorum.refuses_vote_message(grant, 3)
    quorum.unverified_voters = {3}
    assert quorum.refuses_vote_message(grant, 3) and quorum.refuses_vote_message(request, 3)
    assert not quorum.refuses_vote_message(entries, 3)  # it still follows the leader
    assert not quorum.refuses_vote_message(grant, 2) and not quorum.refuses_vote_message(
        grant, None
    )
