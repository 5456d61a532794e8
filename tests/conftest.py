"""Shared pytest set-up: the repository root on ``sys.path`` (tests import ``tests.harness``)."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: Modules that take longest (minutes: a cluster per module, Spark audits, the demo), slowest
#: first. ``make test`` runs whole modules on two workers (``--dist loadfile``) in collection
#: order, so starting the long ones first keeps one worker from running a long module alone at
#: the end while the other is idle. Every other module follows in its usual order, unit tests
#: last (they fill the gaps).
SLOW_FIRST = (
    "integration/test_demo.py",
    "spark/test_audit_incremental.py",
    "spark/test_audit_cluster.py",
    "integration/test_broker_integration.py",
    "integration/test_controller_integration.py",
    "integration/test_chaos.py",
    "integration/test_transactions.py",
    "integration/test_controller_stall.py",
    "spark/test_audit_tamper.py",
    "spark/test_audit_findings.py",
    "spark/test_audit_tables.py",
    "integration/test_consumer_groups.py",
    "integration/test_deploy_example.py",
    "integration/test_chaos_disk.py",
    "integration/test_storage_faults.py",
    "integration/test_retention.py",
    "integration/test_divergence_alarm.py",
    "integration/test_election_safety.py",
    "integration/test_metrics.py",
    "integration/test_rolling_upgrade.py",
    "integration/test_controller_failover_history.py",
)


def _rank(path: Path) -> int:
    rel = path.relative_to(REPO / "tests").as_posix()
    if rel in SLOW_FIRST:
        return SLOW_FIRST.index(rel)
    return len(SLOW_FIRST) + (1 if rel.startswith("unit/") else 0)


def pytest_collection_modifyitems(items: list) -> None:
    """Slow modules first, unit tests last; the order within a module is kept."""
    items.sort(key=lambda item: _rank(Path(str(item.path))))
