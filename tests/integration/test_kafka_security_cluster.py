"""A real broker with a SASL_SSL client listener (and a plaintext replication listener): kcat
and confluent-kafka produce and consume with SASL/PLAIN over TLS; a wrong password and a
plaintext client get nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from broker.state import describe
from kraft.rpc.auth import ClientCredentials, hash_password
from tests.harness import LocalCluster, kraft, poll
from tools.free_ports import pick_free_ports

pytestmark = pytest.mark.integration


def _free_port() -> int:
    return pick_free_ports(1)[0]


def _kcat(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["kcat", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(
    subprocess.run(["which", "kcat"], capture_output=True).returncode != 0,
    reason="kcat not installed",
)
def test_sasl_ssl_listener_with_kcat_and_confluent(tmp_path):
    cert, key, users = tmp_path / "broker.pem", tmp_path / "broker.key", tmp_path / "users"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    users.write_text(f"alice:{hash_password('s3cret', iterations=1000)}\n")
    alice = ClientCredentials("alice", "s3cret")
    c = LocalCluster(tmp_path / "c")
    try:
        c.up(1, 1)
        b = next(x for x in c.meta["brokers"] if x["id"] == 101)
        c.kill(101, "TERM")
        props = Path(b["config"])
        lines = [
            ln
            for ln in props.read_text().splitlines()
            if not ln.startswith(("listeners=", "advertised.listeners="))
        ]
        lines += [
            f"listeners=SASL_SSL://127.0.0.1:{b['port']},REPL://127.0.0.1:{_free_port()}",
            "listener.security.protocol.map=REPL:PLAINTEXT",
            "inter.broker.listener.name=REPL",
            f"ssl.certificate.location={cert}",
            f"ssl.key.location={key}",
            f"sasl.plain.users.file={users}",
        ]
        props.write_text("\n".join(lines) + "\n")
        c.start(101)
        poll(
            lambda: describe(b["host"], b["admin_port"], credentials=alice)["state"] == "RUNNING",
            60,
            what="broker RUNNING",
        )
        kraft(
            "topics",
            "create",
            "secure",
            "--partitions",
            "1",
            "--replication-factor",
            "1",
            "--cluster",
            str(c.dir),
        )
        sasl = [
            "-b",
            f"127.0.0.1:{b['port']}",
            "-X",
            "security.protocol=SASL_SSL",
            "-X",
            "sasl.mechanisms=PLAIN",
            "-X",
            f"ssl.ca.location={cert}",
            "-X",
            "sasl.username=alice",
        ]
        messages = "\n".join(f"m{i}" for i in range(100)) + "\n"
        produced = subprocess.run(
            ["kcat", *sasl, "-X", "sasl.password=s3cret", "-P", "-t", "secure", "-X", "acks=all"],
            input=messages,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert produced.returncode == 0, produced.stderr
        consumed = _kcat(
            *sasl, "-X", "sasl.password=s3cret", "-C", "-t", "secure", "-o", "beginning", "-e", "-q"
        )
        assert consumed.returncode == 0, consumed.stderr
        assert consumed.stdout.split() == [f"m{i}" for i in range(100)]

        wrong = _kcat(*sasl, "-X", "sasl.password=nope", "-L", "-m", "5", timeout=30)
        assert wrong.returncode != 0 and "uthentication" in wrong.stderr, wrong.stderr
        plain = _kcat("-b", f"127.0.0.1:{b['port']}", "-L", "-m", "5", timeout=30)
        assert plain.returncode != 0

        from confluent_kafka import Producer

        p = Producer(
            {
                "bootstrap.servers": f"127.0.0.1:{b['port']}",
                "security.protocol": "SASL_SSL",
                "sasl.mechanisms": "PLAIN",
                "sasl.username": "alice",
                "sasl.password": "s3cret",
                "ssl.ca.location": str(cert),
                "acks": "all",
            }
        )
        for i in range(10):
            p.produce("secure", f"c{i}".encode())
        assert p.flush(30) == 0
        again = _kcat(
            *sasl, "-X", "sasl.password=s3cret", "-C", "-t", "secure", "-o", "beginning", "-e", "-q"
        )
        assert again.stdout.split()[-10:] == [f"c{i}" for i in range(10)]
        log = Path(b["log_file"]).read_text()
        assert "authenticated as User:alice" in log and "authentication failed" in log
    finally:
        c.down()
