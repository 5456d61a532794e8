"""Helpers for integration tests: run the real ``kraft`` CLI, start/stop real local clusters,
poll for conditions with deadlines, and read nodes' metadata logs."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.free_ports import pick_free_ports

REPO = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=str(REPO), KRAFT_LOG_LEVEL="INFO")


def kraft(
    *args: str, timeout: float = 60, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``kraft ARGS`` as a user would; raise with its output if it fails and ``check``."""
    proc = subprocess.run(
        [sys.executable, "-m", "tools.cli", *args],
        cwd=REPO,
        env=ENV if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"kraft {' '.join(args)} exited {proc.returncode}\n"
            f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
        )
    return proc


def kraft_json(*args: str, timeout: float = 60, env: dict[str, str] | None = None) -> Any:
    return json.loads(kraft(*args, "--json", timeout=timeout, env=env).stdout)


def poll(
    condition: Callable[[], Any], timeout: float, interval: float = 0.1, what: str = "condition"
) -> Any:
    """Call ``condition`` until it returns something truthy; fail after ``timeout`` seconds.
    Exceptions count as "not yet" (the last one is reported)."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as e:
            last_error = e
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what}; last error: {last_error!r}"
    )


class LocalCluster:
    """A cluster started with ``kraft cluster up --detach`` in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.sim_brokers: subprocess.Popen[str] | None = None

    @property
    def meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = json.loads((self.dir / "cluster.json").read_text())
        return meta

    def up(self, controllers: int = 3, brokers: int = 0, *extra: str) -> LocalCluster:
        kraft(
            "cluster",
            "up",
            "--dir",
            str(self.dir),
            "--controllers",
            str(controllers),
            "--brokers",
            str(brokers),
            "--detach",
            *extra,
            timeout=120,
        )
        return self

    def credentials(self, user: str = "admin") -> Any:
        """``user``'s RPC credentials (``cluster up`` makes admin, broker and controller), or
        None for a cluster started with ``--no-auth``."""
        from kraft.rpc.auth import ClientCredentials

        auth_dir = self.meta.get("auth_dir")
        return ClientCredentials.load(Path(auth_dir) / f"{user}.credentials") if auth_dir else None

    def cli_env(self) -> dict[str, str]:
        """The environment for ``kraft ... --bootstrap-controller`` as the admin user (with
        ``--cluster DIR`` the CLI finds the credentials itself)."""
        auth_dir = self.meta.get("auth_dir")
        if not auth_dir:
            return dict(ENV)
        return dict(ENV, KRAFT_RPC_CREDENTIALS_FILE=str(Path(auth_dir) / "admin.credentials"))

    def call(
        self, api: str, body: dict[str, Any], node_id: int | None = None, timeout: float = 10
    ) -> dict[str, Any]:
        """One controller RPC call as the admin user (to ``node_id``, else any controller)."""
        from kraft.rpc.client import call_sync

        nodes = [self.controller(node_id)] if node_id else self.meta["controllers"]
        return call_sync(
            [(c["host"], c["rpc_port"]) for c in nodes],
            api,
            body,
            timeout,
            credentials=self.credentials(),
        )

    def use_sasl_listener(self, broker_id: int, users_file: Path, **extra: str) -> dict[str, Any]:
        """Restart broker ``broker_id`` with a SASL_PLAINTEXT client listener on its port
        (users from ``users_file``, hashed) and a loopback PLAINTEXT replication listener, plus
        ``extra`` properties; returns its cluster.json entry once it runs again."""
        from broker.state import describe
        from kraft.config import load_properties, write_properties
        from kraft.rpc.auth import ClientCredentials, hash_password

        b = next(x for x in self.meta["brokers"] if x["id"] == broker_id)
        # a SASL broker's admin endpoint wants a user of its users file: add one for the harness
        me = ClientCredentials("kraft-harness", "harness-password")
        users = self.dir / f"broker-{broker_id}-sasl-users"
        users.write_text(
            Path(users_file).read_text()
            + f"{me.username}:{hash_password(me.password, iterations=1000)}\n"
        )

        def state() -> str | None:
            try:
                now: str = describe(b["host"], b["admin_port"], timeout=2.0, credentials=me)[
                    "state"
                ]
                return now
            except Exception:
                return None

        self.kill(broker_id, "TERM")
        poll(lambda: state() is None, 30, what=f"broker {broker_id} stopped")
        (repl_port,) = pick_free_ports(1)
        props = load_properties(b["config"])
        props.pop("advertised.listeners", None)
        props.update(
            {
                "listeners": f"SASL_PLAINTEXT://127.0.0.1:{b['port']},REPL://127.0.0.1:{repl_port}",
                "listener.security.protocol.map": "REPL:PLAINTEXT",
                "inter.broker.listener.name": "REPL",
                "sasl.plain.users.file": str(users),
                **extra,
            }
        )
        write_properties(b["config"], props)
        self.start(broker_id)
        poll(lambda: state() == "RUNNING", 60, what=f"broker {broker_id} running with SASL")
        return next(x for x in self.meta["brokers"] if x["id"] == broker_id)

    def controller(self, node_id: int) -> dict[str, Any]:
        return next(c for c in self.meta["controllers"] if c["id"] == node_id)

    def bootstrap(self, node_id: int) -> str:
        c = self.controller(node_id)
        return f"{c['host']}:{c['rpc_port']}"

    def active_controller(self) -> int:
        status = kraft_json("quorum", "status", "--cluster", str(self.dir))
        leader: int = status["leader_id"]
        assert leader > 0, status
        return leader

    def kill(self, node_id: int, sig: str = "KILL") -> None:
        kraft("cluster", "kill", "--dir", str(self.dir), "--node", str(node_id), "--signal", sig)

    def start(self, node_id: int | None = None) -> None:
        args = ["cluster", "start", "--dir", str(self.dir)]
        if node_id is not None:
            args += ["--node", str(node_id)]
        kraft(*args, timeout=120)

    def start_sim_brokers(self, count: int = 3, racks: str = "") -> None:
        """Run simulated brokers (real RPC: register, follow the log, heartbeat) in a subprocess."""
        cmd = [
            sys.executable,
            "-m",
            "testsupport.sim_broker",
            "--cluster",
            str(self.dir),
            "--count",
            str(count),
        ]
        if racks:
            cmd += ["--racks", racks]
        sims = self.sim_brokers = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        assert sims.stdout is not None  # stdout=PIPE
        out = sims.stdout
        line = poll(out.readline, 60, what="simulated brokers ready")
        assert line.strip() == "ready", line

    def down(self) -> None:
        if self.sim_brokers is not None:
            os.killpg(self.sim_brokers.pid, signal.SIGKILL)
            self.sim_brokers.wait(10)
            self.sim_brokers = None
        if (self.dir / "cluster.json").exists():
            kraft(
                "cluster",
                "down",
                "--dir",
                str(self.dir),
                "--timeout",
                "20",
                check=False,
                timeout=60,
            )
            for node in self.meta["controllers"] + self.meta.get("brokers", []):
                pid = node.get("pid")
                if pid:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    def log_dir(self, node_id: int) -> Path:
        return Path(self.controller(node_id)["metadata_dir"]) / "log"


def log_stream_digest(log_dir: Path) -> tuple[int, str]:
    """(next offset, SHA-256 of every batch's encoding in order) of a metadata log directory."""
    from kraft.log.metadata_log import MetadataLog

    h = hashlib.sha256()
    with MetadataLog.open(log_dir, fsync="never") as mlog:
        for batch in mlog.read_batches(mlog.start_offset):
            h.update(batch.encode())
        return mlog.next_offset, h.hexdigest()
