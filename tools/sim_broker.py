"""Lightweight simulated brokers for benchmarks and controller tests.

A :class:`SimBroker` speaks the real controller RPC: it registers with a fresh incarnation id,
long-polls ``FetchMetadata`` to learn the log end it has "replayed" (it keeps no partition logs
and builds no image), and heartbeats with that offset, so the controller unfences it exactly as it
would a real broker. Many of them run in one trio process.
"""
from __future__ import annotations

import uuid
from typing import Any
from dataclasses import dataclass, field

import trio

from kraft.errors import ErrorCode, KraftError
from kraft.rpc.client import ControllerClient


@dataclass
class SimBroker:
    broker_id: int
    bootstrap: list[tuple[str, int]]
    cluster_id: str
    rack: str | None = None
    heartbeat_interval_s: float = 0.5
    epoch: int = -1
    metadata_offset: int = -1
    fenced: bool = True
    incarnation_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    want_shutdown: bool = False
    shut_down: bool = False
    credentials: Any = None  # kraft.rpc.auth.ClientCredentials for clusters with RPC auth

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Register, then follow the log and heartbeat until cancelled or shut down."""
        client = ControllerClient(self.bootstrap, client_id=f"sim-broker-{self.broker_id}",
                                  credentials=self.credentials)
        try:
            await self._register(client)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._follow_log)
                task_status.started(self)
                await self._heartbeat_loop(client)
                nursery.cancel_scope.cancel()
        finally:
            await client.aclose()

    async def _register(self, client: ControllerClient) -> None:
        body = {"broker_id": self.broker_id, "cluster_id": self.cluster_id,
                "incarnation_id": self.incarnation_id,
                "listeners": [{"name": "PLAINTEXT", "host": "127.0.0.1", "port": 19000 + self.broker_id,
                               "security_protocol": "PLAINTEXT"}],
                "rack": self.rack,
                "features": [{"name": "metadata.version", "min_version": 1, "max_version": 1000}]}
        result = await client.call("BrokerRegistration", body, timeout=30)
        self.epoch = result["broker_epoch"]

    async def _follow_log(self) -> None:
        client = ControllerClient(self.bootstrap, client_id=f"sim-broker-{self.broker_id}-fetch",
                                  credentials=self.credentials)
        try:
            while True:
                try:
                    result = await client.call("FetchMetadata", {"from_offset": self.metadata_offset + 1,
                                                                 "max_wait_ms": 500}, timeout=10)
                except KraftError:
                    await trio.sleep(0.1)
                    continue
                self.metadata_offset = max(self.metadata_offset, result["high_watermark"] - 1)
        finally:
            await client.aclose()

    async def _heartbeat_loop(self, client: ControllerClient) -> None:
        while True:
            try:
                reply = await client.call("BrokerHeartbeat", {
                    "broker_id": self.broker_id, "broker_epoch": self.epoch,
                    "metadata_offset": self.metadata_offset, "want_fence": False,
                    "want_shutdown": self.want_shutdown}, timeout=10)
            except KraftError as e:
                if e.code in (ErrorCode.STALE_BROKER_EPOCH, ErrorCode.BROKER_ID_NOT_REGISTERED):
                    await self._register(client)
                else:
                    await trio.sleep(0.1)
                continue
            self.fenced = reply["is_fenced"]
            if reply["should_shut_down"]:
                self.shut_down = True
                return
            await trio.sleep(self.heartbeat_interval_s)


async def wait_unfenced(brokers: list[SimBroker], timeout_s: float) -> None:
    """Wait until every broker is unfenced, or raise ``trio.TooSlowError``."""
    with trio.fail_after(timeout_s):
        while any(b.fenced for b in brokers):
            await trio.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.sim_broker --cluster DIR --count N``: run N simulated brokers until killed."""
    import argparse
    import json
    from pathlib import Path

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cluster", required=True, help="cluster directory (reads cluster.json)")
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--first-id", type=int, default=101)
    parser.add_argument("--racks", default="", help="comma-separated racks, assigned round-robin")
    args = parser.parse_args(argv)
    meta = json.loads((Path(args.cluster) / "cluster.json").read_text())
    bootstrap = [(c["host"], c["rpc_port"]) for c in meta["controllers"]]
    racks = [r for r in args.racks.split(",") if r]
    credentials = None
    if meta.get("auth_dir"):  # a cluster started with --auth: log in as its broker user
        from kraft.rpc.auth import ClientCredentials
        credentials = ClientCredentials.load(Path(meta["auth_dir"]) / "broker.credentials")
    brokers = [SimBroker(args.first_id + i, bootstrap, meta["cluster_id"],
                         rack=racks[i % len(racks)] if racks else None, credentials=credentials)
               for i in range(args.count)]

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            for b in brokers:
                nursery.start_soon(b.run)
            await wait_unfenced(brokers, 60)
            print("ready", flush=True)

    trio.run(run)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
