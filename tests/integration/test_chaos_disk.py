"""Chaos disk faults on a real cluster (3 controllers, 3 brokers, the chaos workload): a
controller's disk fills (a real ENOSPC on its own tmpfs) and it must exit 3, be restarted once
the disk is freed and catch up; a controller's directory is wiped and it must refuse to start,
then come back through ``kraft storage recover --from-peers``. The history checker (no lost
acknowledged write, one history, availability) must find nothing wrong.

Kept out of ``test_chaos.py`` so that run keeps its length; the full disk needs a tmpfs mount
(root) and is skipped where that is not allowed, the wiped disk runs everywhere."""

from __future__ import annotations

import pytest

from tests.chaos.disk import can_mount
from tests.chaos.runner import ChaosRun

pytestmark = pytest.mark.integration


@pytest.mark.timeout(420)  # ~110 s on 2 loaded cores; a hang still fails
def test_full_and_wiped_disks_lose_nothing_and_rejoin(tmp_path) -> None:
    mountable = can_mount()
    rounds = ["full-disk", "wiped-disk"] if mountable else ["wiped-disk"]
    with ChaosRun(
        tmp_path / "cluster", seed=11, brokers=3, workers=3, log=print, disk_faults=mountable
    ) as run:
        for kind in rounds:
            run.run_round(kind)
        report = run.finish()
    summary = report.summary()
    print(summary)
    assert summary["anomalies"] == 0, summary["anomaly_details"]
    assert all(f.recovery_s is not None for f in report.faults)
    expected = {"wiped-disk: refused, recovered from peers": 1}
    if mountable:
        expected["full-disk: exit 3"] = 1
    assert summary["disk_outcomes"] == expected
    assert summary["operations"]["ok"] >= 20, summary["operations"]
    if not mountable:
        pytest.skip("wiped disk passed; the full disk needs a tmpfs mount (root)")
