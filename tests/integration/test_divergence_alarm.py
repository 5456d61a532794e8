"""Divergence alarms on a real quorum: one voter's metadata log is rewritten by hand while it is
stopped (a batch's provenance changed, the chain re-sealed after it, so the log passes its own
checks), then the voter rejoins. The active controller must name it, with the first offset where
the histories part, in an ERROR line, in ``kraft quorum status|replication`` and in the
``kraft_controller_divergent_voters`` metric; the intact voter stays clean. The rewritten voter,
finding a majority against its history, steps out of the quorum (exit 3), refuses to start
again until ``kraft storage recover --from-peers``, and after it rejoins clean."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import psutil
import pytest
from harness import LocalCluster, kraft, kraft_json, poll

from kraft.log import MetadataLog
from kraft.records import Provenance, batch_hash
from kraft.storage.failure import EXIT_STORAGE_FAILURE

pytestmark = pytest.mark.integration


def rewrite_from(log_dir: Path, offset: int) -> int:
    """Give the batch holding ``offset`` another principal and re-chain every batch after it
    (what a careful forger or a buggy node would leave); returns that batch's base offset."""
    with MetadataLog.open(log_dir, fsync="never") as old:
        batches = list(old.read_batches(old.start_offset))
    fresh = log_dir.parent / "rewritten"
    shutil.rmtree(fresh, ignore_errors=True)
    edited = -1
    with MetadataLog.open(fresh, fsync="always") as new:
        prev = None
        for b in batches:
            if b.base_offset <= offset <= b.last_offset:
                edited = b.base_offset
                b = dataclasses.replace(b, provenance=Provenance("User:mallory", "forged"))
            if prev is not None:
                b = dataclasses.replace(b, prev_hash=prev)
            encoded = b.encode()
            new.append_encoded(encoded, b)
            prev = batch_hash(encoded) if edited >= 0 else None
    for seg in log_dir.glob("*.log"):
        seg.unlink()
    for seg in fresh.glob("*.log"):
        seg.rename(log_dir / seg.name)
    shutil.rmtree(fresh)
    return edited


def pid_gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped yet counts as exited)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_voter_with_a_rewritten_log_is_named_with_the_first_differing_offset(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path / "c").up(3, 0, "--no-auth", "--metrics")
    try:
        for i in range(6):  # a history to rewrite: broker-default config changes
            kraft(
                "configs",
                "alter",
                "--broker-defaults",
                "--set",
                f"background.threads={i + 2}",
                "--cluster",
                str(cluster.dir),
            )
        leader = cluster.active_controller()
        victim, intact = [n for n in (1, 2, 3) if n != leader]
        middle = (
            kraft_json("quorum", "status", "--cluster", str(cluster.dir))["high_watermark"] // 2
        )
        cluster.kill(victim, "TERM")
        forged_from = rewrite_from(cluster.log_dir(victim), middle)
        assert forged_from >= 0
        cluster.start(victim)

        def named() -> dict | None:
            status = kraft_json("quorum", "status", "--cluster", str(cluster.dir))
            return status if status["divergent_voters"] == [victim] else None

        status = poll(named, 60, interval=1.0, what=f"voter {victim} reported divergent")
        rows = {
            r["node_id"]: r
            for r in kraft_json("quorum", "replication", "--cluster", str(cluster.dir))["replicas"]
        }
        assert rows[victim]["divergent_from_offset"] == forged_from
        assert rows[intact]["divergent_from_offset"] is None
        assert rows[intact]["log_head_hash"]
        table = kraft("quorum", "replication", "--cluster", str(cluster.dir)).stdout
        assert f"from offset {forged_from}" in table
        leader_log = Path(cluster.controller(status["leader_id"])["metadata_dir"]).parent
        text = (leader_log / "node.log").read_text(errors="replace")
        assert (
            f"voter {victim}'s metadata log differs from the leader's from offset {forged_from}"
            in text
        )
        assert "ERROR" in text and "kraft storage recover --from-peers" in text
        assert text.count(f"voter {victim}'s metadata log differs") == 1  # once, not per check

        from urllib.request import urlopen

        lead = cluster.controller(status["leader_id"])
        with urlopen(f"http://{lead['host']}:{lead['metrics_port']}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        assert "kraft_controller_divergent_voters 1.0" in metrics

        victim_log = Path(cluster.controller(victim)["log_file"])
        poll(
            lambda: "steps out of the quorum" in victim_log.read_text(errors="replace"),
            60,
            interval=1.0,
            what=f"voter {victim} stepping out",
        )
        poll(lambda: pid_gone(cluster.controller(victim)["pid"]), 30, what=f"{victim} exited")
        said = victim_log.read_text(errors="replace")
        assert f"from offset {forged_from}" in said and f"(exit {EXIT_STORAGE_FAILURE})" in said
        config = cluster.controller(victim)["config"]
        again = kraft("controller", "--config", config, check=False, timeout=120)
        assert again.returncode == 1 and "stepped out of the quorum" in again.stderr, again
        assert kraft("storage", "recover", "--config", config, "--from-peers").returncode == 0
        cluster.start(victim)
        poll(
            lambda: (
                kraft_json("quorum", "status", "--cluster", str(cluster.dir))["divergent_voters"]
                == []
            ),
            60,
            interval=1.0,
            what=f"voter {victim} rebuilt and agreeing",
        )
    finally:
        cluster.down()
