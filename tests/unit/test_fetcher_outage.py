"""An unreachable leader is reported once when the outage starts, then every 30 s, and once
when it ends: not once per reconnect attempt (attempts come every 0.2 s)."""

from __future__ import annotations

import logging

from broker.replica.replica_fetcher import _Outage


def test_one_line_per_outage_not_per_attempt(caplog) -> None:
    caplog.set_level(logging.INFO, logger="broker")
    outage = _Outage(102)
    outage.ended(0.0)  # a working fetch with no outage says nothing
    for i in range(150):  # 30 s of attempts 0.2 s apart
        outage.failed(10.0 + i * 0.2, "Connection refused")
    outage.failed(40.0, "Connection refused")
    outage.ended(41.0)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "fetcher for leader 102: Connection refused; retrying every 0.2 s",
        "fetcher for leader 102: still failing after 30 s and 151 attempts: Connection refused",
        "fetcher for leader 102: reached again after 31.0 s and 151 failed attempts",
    ]
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING", "INFO"]
