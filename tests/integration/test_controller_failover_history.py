"""Kill -9 of the active controller with 32 writes in flight, judged by the chaos harness's
history checker (tests/chaos/history.py): no acknowledged write is lost, no write is applied
twice, and every controller's metadata log is byte-identical afterwards."""

from __future__ import annotations

import time

import pytest

from tests.chaos.history import OK
from tests.chaos.runner import ChaosRun

pytestmark = pytest.mark.integration

IN_FLIGHT = 32
SESSION_TIMEOUT_MS = 15_000


@pytest.mark.timeout(420)
def test_killing_the_active_controller_under_32_writes_in_flight(tmp_path) -> None:
    run = ChaosRun(
        tmp_path / "cluster", seed=20, brokers=3, workers=IN_FLIGHT, op_pause_s=0.1, log=print
    )
    # Three brokers replaying ~200 metadata offsets/s on two cores shared with three controllers
    # and 32 writers answer heartbeats late: a longer session keeps this test about the writes.
    run.cluster.session_timeout_ms = SESSION_TIMEOUT_MS
    with run:
        deadline = time.monotonic() + 120
        while run.history.counts().get(OK, 0) < 3 * IN_FLIGHT:  # the workload is in full swing
            assert time.monotonic() < deadline, run.history.counts()
            time.sleep(0.2)
        leader = run._leader()
        run._controller_target = lambda: (leader, "the leader")  # type: ignore[method-assign]  # pin the target for this test
        fault = run.run_round("kill-controller")
        assert fault.target == leader
        acked_before = run.history.counts().get(OK, 0)
        deadline = time.monotonic() + 60
        while run.history.counts().get(OK, 0) < acked_before + IN_FLIGHT:  # writes go on
            assert time.monotonic() < deadline, run.history.counts()
            time.sleep(0.2)
        report = run.finish()
    summary = report.summary()
    print(summary)
    assert summary["anomalies"] == 0, summary["anomaly_details"]
    assert fault.recovery_s is not None
    assert summary["raft_terms_seen"] >= 2  # leadership really moved
