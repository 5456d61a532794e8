"""Controller RPC authentication and the Raft port: an unauthenticated process cannot make a
controller apply anything over either port.

Unit tests cover the credential files and the handshake against an in-process ``RpcServer``; the
integration test runs a real controller (``kraft cluster up --auth`` with a Raft secret) and
attacks its RPC and Raft ports from this process."""

from __future__ import annotations

import functools
import json
import logging
import os
import pickle
import re
import socket
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import ENV, REPO, LocalCluster, kraft, poll

from kraft.config import ConfigError, ControllerConfig
from kraft.errors import ErrorCode, KraftError
from kraft.records import decode_batch
from kraft.rpc.auth import (
    AuthError,
    ClientCredentials,
    CredentialStore,
    hash_password,
    write_cluster_credentials,
)
from kraft.rpc.client import ControllerClient
from kraft.rpc.framing import FrameDecoder, encode_frame
from kraft.rpc.server import RequestContext, RpcServer
from tools.free_ports import pick_free_ports

pytestmark = pytest.mark.timeout(120)
FAST = 1_000  # PBKDF2 iterations for unit tests (the minimum a file may hold)


def trio_test(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        trio.run(functools.partial(fn, *args, **kwargs))

    return wrapper


def users_file(tmp_path: Path, **users: str) -> Path:
    path = tmp_path / "rpc-users"
    path.write_text(
        "# users\n"
        + "".join(f"{n}:{hash_password(p, iterations=FAST)}\n" for n, p in users.items())
    )
    return path


# ---- credential files ----------------------------------------------------------------------


def test_store_verifies_only_the_right_password(tmp_path: Path) -> None:
    store = CredentialStore.load(users_file(tmp_path, alice="s3cret", bob="other"))
    assert store.verify("alice", "s3cret") == "User:alice"
    assert store.verify("bob", "other") == "User:bob"
    assert store.verify("alice", "other") is None
    assert store.verify("alice", "s3cret ") is None
    assert store.verify("mallory", "s3cret") is None
    for name, password in [
        (None, "s3cret"),
        ("alice", None),
        (["alice"], "s3cret"),
        ("alice", 7),
        ("alice", "s3cret" * 1000),
    ]:
        assert store.verify(name, password) is None


def test_hashes_are_salted_and_hold_no_password(tmp_path: Path) -> None:
    one, two = hash_password("pw-123456"), hash_password("pw-123456")
    assert one != two and "pw-123456" not in one
    files = write_cluster_credentials(tmp_path / "auth", iterations=FAST)
    users = (tmp_path / "auth" / "rpc-users").read_text()
    for user, path in files.items():
        creds = ClientCredentials.load(path)
        assert creds.username == user and creds.password not in users
        assert creds.password not in repr(creds)
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        assert (
            CredentialStore.load(tmp_path / "auth" / "rpc-users").verify(user, creds.password)
            == f"User:{user}"
        )


@pytest.mark.parametrize(
    "line, problem",
    [
        ("alice", "expected NAME:pbkdf2_sha256"),
        ("al ice:pbkdf2_sha256$1000$c2FsdHNhbHQ=$" + "A" * 43 + "=", "expected NAME"),
        ("alice:plaintext-password", "expected pbkdf2_sha256$ITERATIONS$SALT$HASH"),
        ("alice:pbkdf2_sha256$10$c2FsdHNhbHQ=$" + "A" * 43 + "=", "iterations must be"),
        ("alice:pbkdf2_sha256$1000$!!$" + "A" * 43 + "=", "expected pbkdf2_sha256"),
    ],
)
def test_bad_credentials_file_names_file_and_line(tmp_path: Path, line: str, problem: str) -> None:
    path = tmp_path / "users"
    path.write_text("# comment\n" + line + "\n")
    with pytest.raises(AuthError, match=re.escape(problem)) as info:
        CredentialStore.load(path)
    assert f"{path}:2" in str(info.value)
    assert "plaintext-password" not in str(info.value)


def test_client_credentials_from_file_or_env_only(tmp_path: Path) -> None:
    path = tmp_path / "admin.credentials"
    path.write_text("username=admin\npassword=pa=ss\n")
    assert ClientCredentials.load(path) == ClientCredentials("admin", "pa=ss")
    assert ClientCredentials.from_env({"KRAFT_RPC_CREDENTIALS_FILE": str(path)}).password == "pa=ss"
    assert ClientCredentials.from_env(
        {"KRAFT_RPC_USERNAME": "u", "KRAFT_RPC_PASSWORD": "p"}
    ) == ClientCredentials("u", "p")
    assert ClientCredentials.from_env({}) is None
    with pytest.raises(AuthError, match="empty password"):
        ClientCredentials.from_env({"KRAFT_RPC_USERNAME": "u"})
    (tmp_path / "bad").write_text("username=admin\n")
    with pytest.raises(AuthError, match="needs username= and password="):
        ClientCredentials.load(tmp_path / "bad")


def test_add_user_command_appends_a_hashed_line(tmp_path: Path) -> None:
    users = tmp_path / "users"
    for name, password in (("alice", "pw-a"), ("bob", "pw-b")):
        proc = subprocess.run(
            [sys.executable, "-m", "kraft.rpc.auth", "add-user", str(users), name],
            input=password + "\n",
            capture_output=True,
            text=True,
            cwd=REPO,
            env=ENV,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
    assert "pw-a" not in users.read_text() and oct(users.stat().st_mode & 0o777) == "0o600"
    store = CredentialStore.load(users)
    assert store.verify("alice", "pw-a") == "User:alice" and store.verify("bob", "pw-a") is None
    bad = subprocess.run(
        [sys.executable, "-m", "kraft.rpc.auth", "add-user", str(users), "no way"],
        input="x\n",
        capture_output=True,
        text=True,
        cwd=REPO,
        env=ENV,
        timeout=60,
    )
    assert bad.returncode == 2 and "bad user name" in bad.stderr
    again = subprocess.run(
        [sys.executable, "-m", "kraft.rpc.auth", "add-user", str(users), "alice"],
        input="x\n",
        capture_output=True,
        text=True,
        cwd=REPO,
        env=ENV,
        timeout=60,
    )
    assert again.returncode == 2 and "already listed" in again.stderr


def _secret(tmp_path: Path) -> Path:
    path = tmp_path / "raft.secret"
    path.write_text("a-test-raft-secret-of-at-least-32-bytes\n")
    path.chmod(0o600)
    return path


def _controller_props(tmp_path: Path, raft_host: str = "127.0.0.1") -> dict[str, str]:
    return {
        "node.id": "1",
        "process.roles": "controller",
        "cluster.id": "c",
        "controller.quorum.voters": "1@127.0.0.1:9000",
        "controller.quorum.raft.voters": f"1@{raft_host}:9001",
        "metadata.log.dir": str(tmp_path),
    }


def test_raft_needs_a_secret_from_file_or_env_loopback_included(tmp_path: Path) -> None:
    props = _controller_props(tmp_path, raft_host="10.1.2.3")
    for without in (props, _controller_props(tmp_path)):
        with pytest.raises(ConfigError, match="controller.raft.secret.file is not set"):
            ControllerConfig.from_properties(without, env={})
    assert (
        ControllerConfig.from_properties(props, env={"KRAFT_RAFT_SECRET": "s" * 32}).raft_secret
        == "s" * 32
    )
    secret = tmp_path / "secret"
    secret.write_text("from-file-with-32-bytes-at-least\n")
    secret.chmod(0o600)
    cfg = ControllerConfig.from_properties(
        dict(props, **{"controller.raft.secret.file": str(secret)}), env={}
    )
    assert cfg.raft_secret == "from-file-with-32-bytes-at-least" and "from-file" not in repr(cfg)
    # The only ways in are the properties file and the environment: the CLI has no secret flag.
    help_text = kraft("controller", "--help").stdout
    assert "--config" in help_text and "secret" not in help_text.lower()


def test_controller_auth_needs_its_own_client_credentials(tmp_path: Path) -> None:
    props = dict(
        _controller_props(tmp_path),
        **{"controller.raft.secret.file": str(_secret(tmp_path))},
        **{"controller.rpc.auth.credentials.file": str(users_file(tmp_path, admin="pw"))},
    )
    with pytest.raises(ConfigError, match="controller.rpc.client.credentials.file is required"):
        ControllerConfig.from_properties(props, env={})
    (tmp_path / "c.credentials").write_text("username=admin\npassword=pw\n")
    props["controller.rpc.client.credentials.file"] = str(tmp_path / "c.credentials")
    cfg = ControllerConfig.from_properties(props, env={})
    assert cfg.rpc_credentials is not None and cfg.rpc_client_credentials is not None
    props["controller.rpc.auth.credentials.file"] = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match="cannot read credentials file"):
        ControllerConfig.from_properties(props, env={})


# ---- the handshake, in process ---------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, RequestContext]] = []

    async def __call__(self, api: str, body: dict, ctx: RequestContext) -> dict:
        self.seen.append((api, ctx))
        return {"ok": True}


async def _raw(port: int, *messages: dict) -> tuple[list[dict], bool]:
    """Send frames on one connection; return the answers and whether the server closed it."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"".join(encode_frame(m) for m in messages))
        dec, out = FrameDecoder(), []
        with trio.fail_after(10):
            while len(out) < len(messages):
                data = await stream.receive_some(65536)
                if not data:
                    return out, True
                out += dec.feed(data)
            with trio.move_on_after(0.5):
                return out, await stream.receive_some(1) == b""
        return out, False


def _auth(user: str, password: str, correlation_id: int = 1) -> dict:
    return {
        "api": "SaslAuthenticate",
        "version": 0,
        "correlation_id": correlation_id,
        "body": {"mechanism": "PLAIN", "username": user, "password": password},
    }


WRITE = {
    "api": "CreateTopics",
    "version": 0,
    "correlation_id": 2,
    "request_id": "r1",
    "principal": "User:root",
    "auth": {"principal": "User:root"},
    "body": {"topics": [{"name": "t", "num_partitions": 1, "replication_factor": 1}]},
}


@trio_test
async def test_unauthenticated_requests_are_refused_and_never_handled(tmp_path: Path) -> None:
    handler = Recorder()
    store = CredentialStore.load(users_file(tmp_path, alice="s3cret"))
    async with trio.open_nursery() as nursery:
        server = RpcServer("127.0.0.1", 0, handler, credentials=store, io_timeout=1.0)
        port = await nursery.start(server.serve)
        for messages in (
            [WRITE],
            [_auth("alice", "wrong"), WRITE],
            [_auth("mallory", "s3cret"), WRITE],
            [dict(_auth("alice", "s3cret"), body={"mechanism": "SCRAM-SHA-256"}), WRITE],
        ):
            answers, closed = await _raw(port, *messages)
            assert closed and len(answers) == 1, answers
            assert answers[0]["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert handler.seen == [] and server.auth_failures == 4
        # Connected but silent: closed once io_timeout passes without a handshake.
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        with trio.fail_after(10):
            assert await stream.receive_some(1) == b""
        await stream.aclose()
        nursery.cancel_scope.cancel()


@trio_test
async def test_principal_is_the_authenticated_one(tmp_path: Path, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)
    handler = Recorder()
    store = CredentialStore.load(users_file(tmp_path, alice="s3cret-alice"))
    async with trio.open_nursery() as nursery:
        server = RpcServer("127.0.0.1", 0, handler, credentials=store)
        port = await nursery.start(server.serve)
        answers, closed = await _raw(
            port,
            _auth("alice", "s3cret-alice"),
            WRITE,
            _auth("alice", "s3cret-alice", correlation_id=3),
        )
        assert not closed
        assert [a["error_code"] for a in answers] == [0, 0, ErrorCode.ILLEGAL_SASL_STATE]
        assert answers[0]["body"] == {"principal": "User:alice"}
        assert [(api, ctx.principal) for api, ctx in handler.seen] == [
            ("CreateTopics", "User:alice")
        ]

        client = ControllerClient(
            [("127.0.0.1", port)], credentials=ClientCredentials("alice", "s3cret-alice")
        )
        assert await client.call("ListTopics", {}) == {"ok": True}
        assert client.principal == "User:alice" and handler.seen[-1][1].principal == "User:alice"
        await client.aclose()

        bad = ControllerClient(
            [("127.0.0.1", port)], credentials=ClientCredentials("alice", "guess")
        )
        started = trio.current_time()
        with pytest.raises(KraftError) as info:
            await bad.call("ListTopics", {}, timeout=30)
        assert info.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert trio.current_time() - started < 10  # refused, not retried until the deadline
        await bad.aclose()
        nursery.cancel_scope.cancel()
    assert "s3cret-alice" not in caplog.text and "guess" not in caplog.text
    assert "authenticated as User:alice" in caplog.text


@trio_test
async def test_handshake_on_a_server_without_auth_is_a_clear_error() -> None:
    async with trio.open_nursery() as nursery:
        server = RpcServer("127.0.0.1", 0, Recorder())
        port = await nursery.start(server.serve)
        client = ControllerClient([("127.0.0.1", port)], credentials=ClientCredentials("a", "b"))
        with pytest.raises(KraftError, match="not enabled") as info:
            await client.call("ListTopics", {})
        assert info.value.code == ErrorCode.ILLEGAL_SASL_STATE
        await client.aclose()
        nursery.cancel_scope.cancel()


# ---- a real controller: neither port lets an unauthenticated process change anything -------


class _Evil:
    """Unpickling this opens (creates) ``path``: proof that code ran."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


def _pysyncobj_frame(obj: Any) -> bytes:
    data = zlib.compress(pickle.dumps(obj), 3)
    return struct.pack("i", len(data)) + data


def _evil_frames(marker: Path) -> bytes:
    """PySyncObj-shaped frames (native i32 length | zlib(pickle)) whose unpickling creates
    ``marker``: the connection handshake value, then an append_entries carrying the payload."""
    return _pysyncobj_frame(_Evil(marker)) + _pysyncobj_frame(
        {
            "type": "append_entries",
            "term": 99,
            "prevLogIdx": 0,
            "prevLogTerm": 0,
            "commit_index": 1,
            "entries": [(_Evil(marker), 1, 99)],
        }
    )


def _send_raw(port: int, data: bytes, chunk: int | None = None) -> None:
    """Send ``data`` (``chunk`` bytes at a time), then read until the peer closes or 0.5 s of
    silence; the peer dropping the connection part-way is an answer too."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            for i in range(0, len(data), chunk or len(data)):
                s.sendall(data[i : i + (chunk or len(data))])
            s.settimeout(0.5)
            while s.recv(65536):
                pass
        except (TimeoutError, ConnectionResetError, BrokenPipeError):
            pass


def test_payload_executes_on_a_raft_port_without_password(tmp_path: Path) -> None:
    """Control for the test below: the same bytes do run code on PySyncObj without a password."""
    marker = tmp_path / "pwned"
    (port,) = pick_free_ports(1)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time, pysyncobj\n"
            f"o = pysyncobj.SyncObj('127.0.0.1:{port}', ['127.0.0.1:1'])\n"
            "time.sleep(60)",
        ],
        cwd=REPO,
        env=ENV,
    )
    try:
        frames = _evil_frames(marker)

        def attack() -> bool:
            _send_raw(port, frames)
            return marker.exists()

        assert poll(attack, 30, interval=0.3, what="the pickle payload to run")
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Three controllers (Raft secret from the environment, RPC auth) and one broker."""
    directory = tmp_path_factory.mktemp("secured") / "c"
    env = dict(ENV, KRAFT_RAFT_SECRET="raft-secret-for-tests-of-32-bytes")
    cluster = LocalCluster(directory)
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "tools.cli",
                "cluster",
                "up",
                "--dir",
                str(directory),
                "--controllers",
                "3",
                "--brokers",
                "1",
                "--auth",
                "--detach",
                "--fsync",
                "never",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, proc.stderr
        yield cluster
    finally:
        cluster.down()


def _admin_call(cluster: LocalCluster, api: str, body: dict, node_id: int = 1) -> dict:
    from kraft.rpc.client import call_sync

    creds = ClientCredentials.load(Path(cluster.meta["auth_dir"]) / "admin.credentials")
    c = cluster.controller(node_id)
    return call_sync([(c["host"], c["rpc_port"])], api, body, 30, credentials=creds)


def _log_ends(cluster: LocalCluster) -> list[int]:
    """Every controller's own metadata log end (DescribeNode is answered by the node asked)."""
    return [
        _admin_call(cluster, "DescribeNode", {"checksum": False}, c["id"])["log_end_offset"]
        for c in cluster.meta["controllers"]
    ]


@pytest.mark.integration
def test_unauthenticated_process_changes_nothing_over_either_port(
    secured: LocalCluster, tmp_path: Path
) -> None:
    cluster = secured
    cluster.controller(1)
    bootstrap = ",".join(f"{n['host']}:{n['rpc_port']}" for n in cluster.meta["controllers"])
    before = poll(
        lambda: (lambda ends: ends if len(set(ends)) == 1 else None)(_log_ends(cluster)),
        60,
        what="the controllers to agree on the log end",
    )
    alter = ("configs", "alter", "--broker-defaults", "--set", "background.threads=7")

    # RPC: no credentials, wrong credentials, a client-claimed principal: all refused.
    for env in ({}, {"KRAFT_RPC_USERNAME": "admin", "KRAFT_RPC_PASSWORD": "guess"}):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "tools.cli",
                *alter,
                "--bootstrap-controller",
                bootstrap,
                "--json",
            ],
            cwd=REPO,
            env=dict(ENV, **env),
            capture_output=True,
            text=True,
            timeout=60,
        )
        answer = json.loads(proc.stdout)
        assert proc.returncode == 1 and answer["error"] == "SASL_AUTHENTICATION_FAILED"
        assert ("KRAFT_RPC_CREDENTIALS_FILE" in answer["message"]) == (not env), answer  # a hint
    for node in cluster.meta["controllers"]:
        answers = trio.run(
            _raw,
            node["rpc_port"],
            dict(
                WRITE,
                api="IncrementalAlterConfigs",
                body={
                    "resources": [
                        {
                            "resource_type": "broker",
                            "resource_name": "",
                            "ops": [{"name": "background.threads", "op": "SET", "value": "9"}],
                        }
                    ]
                },
            ),
        )[0]
        assert answers[0]["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED

    # Raft ports (password-protected): garbage, a huge length prefix, byte-at-a-time junk, and
    # PySyncObj-shaped pickles that would run code if unpickled (append_entries to followers too).
    marker = tmp_path / "pwned"
    evil = _evil_frames(marker)
    for node in cluster.meta["controllers"]:
        raft_port = node["raft_port"]
        _send_raw(raft_port, os.urandom(4096))
        _send_raw(raft_port, struct.pack("i", 2**31 - 1) + b"x" * 1000)
        _send_raw(raft_port, struct.pack("i", -5) + b"junk")
        _send_raw(raft_port, evil)
        _send_raw(raft_port, evil[:40], chunk=1)
        _send_raw(raft_port, evil + evil + os.urandom(100), chunk=7)
    assert not marker.exists()
    assert _log_ends(cluster) == before

    # The quorum still works, and what it writes carries the authenticated principal: the
    # broker registered as User:broker, the CLI writes as User:admin.
    proc = subprocess.run(
        [sys.executable, "-m", "tools.cli", *alter, "--cluster", str(cluster.dir)],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    after = poll(
        lambda: (lambda ends: ends if len(set(ends)) == 1 and ends != before else None)(
            _log_ends(cluster)
        ),
        60,
        what="the write to reach every controller",
    )
    assert after[0] == before[0] + 1
    fetched = _admin_call(cluster, "FetchMetadata", {"from_offset": 0, "max_wait_ms": 0})
    batches = [decode_batch(b) for b in fetched["batches"]]
    principals = {b.provenance.api: b.provenance.principal for b in batches}
    assert principals["BrokerRegistration"] == "User:broker"
    assert principals["IncrementalAlterConfigs"] == "User:admin"
    assert batches[-1].base_offset == before[0] and not marker.exists()
    assert all(_is_alive(n["pid"]) for n in cluster.meta["controllers"])


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.integration
def test_tools_log_in_to_a_cluster_with_auth(secured: LocalCluster) -> None:
    """The live shell (FetchMetadata) and simulated brokers use the cluster's credentials."""
    proc = kraft("shell", "--cluster", str(secured.dir), "-c", "ls /brokers", timeout=90)
    assert "101/" in proc.stdout.split(), proc.stdout
    sim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "testsupport.sim_broker",
            "--cluster",
            str(secured.dir),
            "--count",
            "1",
            "--first-id",
            "201",
        ],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:  # it prints "ready" once registered, following the log and unfenced: it logged in
        assert (
            poll(lambda: sim.stdout.readline(), 90, what="the simulated broker").strip() == "ready"
        )
        cluster = _admin_call(secured, "DescribeCluster", {})
        assert any(b["broker_id"] == 201 and not b["fenced"] for b in cluster["brokers"])
    finally:
        sim.kill()
        sim.wait(10)
