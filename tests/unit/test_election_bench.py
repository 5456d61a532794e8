"""The election benchmark's pure parts: the timings derived from the election-timeout key,
the property rewrite, and counting elections from polled (term, leader) samples."""

from __future__ import annotations

from pathlib import Path

from bench.election_bench import median, set_property, settings_of, term_changes


def test_settings_follow_the_controllers_derivation() -> None:
    assert settings_of(1000) == {
        "election_timeout_ms": 1000,
        "raft_min_timeout_s": 0.4,
        "raft_max_timeout_s": 1.0,
        "heartbeat_s": 0.1,
    }
    # below a 0.4 s minimum the heartbeat is a quarter of the minimum
    assert settings_of(400)["raft_min_timeout_s"] == 0.16
    assert settings_of(400)["heartbeat_s"] == 0.04


def test_set_property_replaces_an_earlier_line(tmp_path: Path) -> None:
    props = tmp_path / "controller.properties"
    props.write_text("a=1\ncontroller.quorum.election.timeout.ms=1000\nb=2\n")
    set_property(props, "controller.quorum.election.timeout.ms", "400")
    lines = props.read_text().splitlines()
    assert lines == ["a=1", "b=2", "controller.quorum.election.timeout.ms=400"]


def test_no_term_change_is_no_election() -> None:
    assert term_changes(3, 1, [(1.0, 3, 1), (2.0, 3, 1)]) == (0, 0, [])


def test_term_jumps_count_every_term_and_leader_changes_apart() -> None:
    samples = [(1.0, 3, 1), (2.0, 5, 1), (3.0, 5, 1), (4.0, 6, 2)]
    elections, leader_changes, changes = term_changes(3, 1, samples)
    assert elections == 3  # 3 -> 5 (two campaigns between polls) -> 6
    assert leader_changes == 1  # only the term-6 election moved leadership
    assert [c["term"] for c in changes] == [5, 6]


def test_a_stale_sample_does_not_count_twice() -> None:
    # a poll answered by a lagging view (lower term) must not make the next sample a change
    elections, _, changes = term_changes(3, 1, [(1.0, 4, 2), (2.0, 3, 1), (3.0, 4, 2)])
    assert elections == 1
    assert len(changes) == 1


def test_median_of_an_even_count_is_the_middle_mean() -> None:
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert median([]) is None
