"""docs/deploy.md taken literally: the files of deploy/example/ (secrets from its make-secrets.sh,
paths rooted per host by the documented sed line) run as six processes on 127.0.0.2–.4, with
TLS + SASL/PLAIN for clients and replication. kcat produces and consumes over SASL_SSL; the
replication-only listener serves no client; systemd-style readiness (NOTIFY_SOCKET) gates a
rolling restart of all six nodes under an acks=all producer: 0 missing, 0 duplicated."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.protocol.kafka_client_security import ClientSecurity, client_security
from broker.replica.replica_fetcher import KafkaConnection
from broker.state import describe
from kraft.rpc.auth import ClientCredentials
from tests.harness import ENV, REPO, kraft, poll

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not (shutil.which("kcat") and shutil.which("openssl")), reason="needs kcat and openssl"
    ),
]
EXAMPLE = REPO / "deploy" / "example"
HOSTS = {1: "127.0.0.2", 2: "127.0.0.3", 3: "127.0.0.4"}
BOOTSTRAP_CONTROLLER = "127.0.0.2:9093"
TOPIC = "orders"


@dataclass
class Node:
    """One node process of the example, with its own systemd-style notify socket."""

    role: str
    host: int
    config: Path
    notify: socket.socket = field(init=False)
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind("\0" + self.notify_name)

    @property
    def notify_name(self) -> str:
        return f"kraft-deploy-test-{os.getpid()}-{self.role}-{self.host}"

    def start(self, out: Path) -> None:
        env = dict(ENV, NOTIFY_SOCKET="@" + self.notify_name)
        with open(out / f"{self.role}-{self.host}.out", "ab") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tools.cli", self.role, "--config", str(self.config)],
                cwd=REPO,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self, timeout: float) -> None:
        """Wait for READY=1 on the notify socket, as systemd's Type=notify does."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"{self.role} {self.host}: no READY=1 within {timeout}s"
            assert self.proc is not None and self.proc.poll() is None, (
                f"{self.role} {self.host} exited with {self.proc and self.proc.returncode}"
            )
            self.notify.settimeout(min(left, 1.0))
            try:
                if b"READY=1" in self.notify.recv(4096).split(b"\n"):
                    return
            except TimeoutError:
                continue

    def stop(self, timeout: float = 40) -> int:
        """SIGTERM, as systemd stops it; the exit code of a clean stop."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self.proc = None
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.notify.close()


def _root_config(root: Path, host: int, role: str) -> Path:
    """The documented rehearsal substitution, run literally: every absolute path value gets the
    host's root prefixed."""
    out = root / f"host{host}" / f"{role}.properties"
    text = subprocess.run(
        [
            "sed",
            "-E",
            f"s#^([^#=]+)=/#\\1={root}/host{host}/#",
            str(EXAMPLE / f"host{host}" / f"{role}.properties"),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    out.write_text(text)
    return out


def _admin_env(root: Path) -> dict[str, str]:
    return dict(ENV, KRAFT_RPC_CREDENTIALS_FILE=str(root / "admin" / "admin.credentials"))


def _kcat_conf(root: Path) -> dict[str, str]:
    conf = {}
    for line in (root / "admin" / "kcat.conf").read_text().splitlines():
        key, _, value = line.partition("=")
        conf[key] = value
    return conf


def _broker_state(root: Path, host: int) -> dict[str, Any]:
    """Broker ``host``'s admin endpoint (loopback, port 9092 + 1000), as the broker user."""
    creds = ClientCredentials.load(root / f"host{host}" / "etc" / "kraft" / "broker.credentials")
    return describe(HOSTS[host], 10092, timeout=10, credentials=creds)


def _in_sync(root: Path) -> bool:
    """Every broker RUNNING, and every partition it hosts led, with ISR = replicas."""
    seen = set()
    for host in HOSTS:
        state = _broker_state(root, host)
        if state["state"] != "RUNNING":
            return False
        for p in state["partitions"]:
            if p["leader"] < 0 or sorted(p["isr"]) != sorted(p["replicas"]):
                return False
            seen.add(p["partition"])
    return seen == {0, 1, 2}


class Producer:
    """An acks=all, idempotent producer in a thread, numbering its values; records which were
    acknowledged."""

    def __init__(self, conf: dict[str, str]) -> None:
        from confluent_kafka import Producer as KafkaProducer

        self.producer = KafkaProducer(
            {
                **conf,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
            }
        )
        self.acked: list[int] = []
        self.failed: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked.append(int(msg.value()))
        else:
            self.failed.append(str(err))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.producer.produce(TOPIC, str(self.sent).encode(), on_delivery=self._delivered)
            self.sent += 1
            self.producer.poll(0.002)
        self.producer.flush(120)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(150)


@pytest.mark.timeout(1800)
def test_documented_example_runs_and_survives_a_rolling_restart(tmp_path: Path) -> None:
    for ip in HOSTS.values():  # the three "hosts" are loopback addresses of this machine
        with socket.socket() as s:
            s.bind((ip, 0))
    root = tmp_path
    subprocess.run(
        [str(EXAMPLE / "make-secrets.sh"), str(root)],
        env=dict(ENV, KRAFT_PYTHON=sys.executable),
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert (root / "host1" / "etc" / "kraft" / "raft.secret").stat().st_mode & 0o077 == 0
    nodes: list[Node] = []
    producer: Producer | None = None
    try:
        for host in HOSTS:
            controller = _root_config(root, host, "controller")
            broker = _root_config(root, host, "broker")
            kraft("storage", "format", "--config", str(controller), "--initial-controllers")
            kraft("storage", "format", "--config", str(broker))
            nodes += [Node("controller", host, controller), Node("broker", host, broker)]
        for n in nodes:
            n.start(root)
        for n in nodes:
            n.wait_ready(240)

        admin = _admin_env(root)
        kraft(
            "topics",
            "create",
            TOPIC,
            "--partitions",
            "3",
            "--replication-factor",
            "3",
            "--bootstrap-controller",
            BOOTSTRAP_CONTROLLER,
            env=admin,
        )
        poll(
            lambda: _in_sync(root),
            120,
            0.5,
            what="every replica in sync (replication over SASL_SSL)",
        )
        # the admin endpoint: on the host's loopback address, and only for a SASL user
        anonymous = describe(HOSTS[1], 10092, timeout=10)
        assert "authentication required" in anonymous["error"] and "partitions" not in anonymous
        wrong = describe(HOSTS[1], 10092, 10, ClientCredentials("broker", "not-the-password"))
        assert wrong == {"error": "authentication failed"}

        kcat = ["kcat", "-F", str(root / "admin" / "kcat.conf")]
        first = "\n".join(f"k{i}" for i in range(100)) + "\n"
        produced = subprocess.run(
            [*kcat, "-P", "-t", TOPIC, "-X", "acks=all"],
            input=first,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert produced.returncode == 0, produced.stderr
        consumed = subprocess.run(
            [*kcat, "-C", "-t", TOPIC, "-o", "beginning", "-e", "-q"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert consumed.returncode == 0, consumed.stderr
        assert sorted(consumed.stdout.split()) == sorted(f"k{i}" for i in range(100))

        # the replication-only listener: no client API, not even for a valid user
        refused = subprocess.run(
            [*kcat, "-b", "127.0.0.2:9091", "-L", "-m", "5"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode != 0
        alice = _kcat_conf(root)
        assert trio.run(_alice_replicating_refused, root, alice)
        log = (root / "host1" / "var" / "log" / "kraft" / "broker.log").read_text()
        assert "replication-only listener" in log and "User:alice is not among" in log
        assert "authenticated as User:broker" in log

        # rolling restart of all six nodes under an acks=all producer
        producer = Producer(alice)
        producer.start()
        poll(lambda: len(producer.acked) > 200, 60, what="the producer's first acks")
        started = time.monotonic()
        for n in nodes:
            if n.role == "controller":
                assert n.stop() == 0
                n.start(root)
                n.wait_ready(240)
        for n in nodes:
            if n.role == "broker":
                assert n.stop() == 0
                n.start(root)
                n.wait_ready(240)
                poll(lambda: _in_sync(root), 120, 0.5, what=f"ISR full after broker {n.host}")
        restart_s = time.monotonic() - started
        acked_before = len(producer.acked)
        poll(lambda: len(producer.acked) > acked_before + 200, 60, what="acks after the restarts")
        producer.stop()
        assert not producer.failed, producer.failed[:5]

        out = subprocess.run(
            [*kcat, "-C", "-t", TOPIC, "-o", "beginning", "-e", "-q"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr
        values = [int(v) for v in out.stdout.split() if not v.startswith("k")]
        acked = set(producer.acked)
        missing = acked - set(values)
        duplicated = len(values) - len(set(values))
        print(
            f"rolling restart of 6 nodes in {restart_s:.1f}s: {len(acked)} acknowledged, "
            f"{len(values)} consumed, {len(missing)} missing, {duplicated} duplicated"
        )
        assert not missing and duplicated == 0
        assert len(acked) == len(producer.acked)
    finally:
        if producer is not None and producer.thread.is_alive():
            producer.stop()
        for n in nodes:
            n.kill()


async def _alice_replicating_refused(root: Path, conf: dict[str, str]) -> bool:
    """A valid client user logged in on the REPLICATION listener, sending what a follower
    sends (a Fetch with a replica id): the connection is closed without an answer."""
    sec = client_security(
        "SASL_SSL",
        {"ssl.ca.location": conf["ssl.ca.location"]},
        ClientCredentials(conf["sasl.username"], conf["sasl.password"]),
    )
    assert isinstance(sec, ClientSecurity)
    conn = await KafkaConnection.open("127.0.0.2", 9091, "not-a-broker", 30, sec)
    from broker.protocol.data_codec import (
        FOLLOWER_FETCH_VERSION,
        FetchRequest,
        write_fetch_request,
    )
    from broker.protocol.kafka_codec import API_FETCH

    try:
        await conn.request(
            API_FETCH,
            FOLLOWER_FETCH_VERSION,
            write_fetch_request(FetchRequest(102, 100, 1, 1 << 20, 0, [])),
            30,
        )
    except (ConnectionError, trio.BrokenResourceError):
        return True
    finally:
        await conn.aclose()
    return False
