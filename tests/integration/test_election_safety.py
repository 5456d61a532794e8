"""Election safety under crash-restarts (issue 7 item 3): controllers kill -9'ed in the middle of
elections, again and again, never let two controllers lead in one Raft term. Leadership is
observed twice: each controller's own "leader in term T" reports (written on PySyncObj's thread)
and the LeaderChange records of the committed log; the logs must also end byte-identical."""

from __future__ import annotations

import pytest

from tests.chaos.runner import ChaosRun

pytestmark = pytest.mark.integration

ROUNDS = 6


def test_crash_restarts_mid_election_never_give_two_leaders_one_term(tmp_path) -> None:
    with ChaosRun(tmp_path / "cluster", seed=11, brokers=1, workers=1, log=print) as run:
        for _ in range(ROUNDS):
            run.run_round("kill-in-election")
        report = run.finish()
    summary = report.summary()
    print(summary, report.leader_reports)
    assert summary["anomalies"] == 0, summary["anomaly_details"]
    # elections really happened: at least one new term per round, each with an observed leader
    assert summary["raft_terms_seen"] > ROUNDS
    assert summary["terms_with_a_leader"] > ROUNDS
