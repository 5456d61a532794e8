"""Secure by default, against real processes: each fault reproduced before the fix is replayed
and must now fail safely.

* ``kraft cluster up`` writes a private Raft secret and turns RPC authentication on; a pickle
  sent to a Raft port is not executed; a 64 MiB frame of zeros or an oversized announcement
  closes the connection without an election; a half-sent frame is closed within seconds.
* Broker APIs need a broker principal; ``on_behalf_of`` is accepted from brokers only.
* A PLAINTEXT Kafka client cannot create or delete topics through a broker of an authenticated
  cluster; through a SASL listener the request runs as the client's principal.
* 1,100 idle connections from one address do not lock out a client from another address.
* Non-loopback listeners without authentication, and a controller without a Raft secret,
  refuse to start with a message naming the key.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import socket
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from kraft.config import load_properties, write_properties
from kraft.errors import ErrorCode, KraftError
from kraft.records import decode_batch
from kraft.rpc.auth import hash_password
from kraft.rpc.client import ControllerClient, call_sync
from kraft.rpc.framing import FrameDecoder, encode_frame
from tests.harness import ENV, REPO, LocalCluster, kraft, poll
from tools.free_ports import pick_free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Three controllers and one broker, started with the defaults of ``kraft cluster up``."""
    c = LocalCluster(tmp_path_factory.mktemp("secure") / "c")
    c.up(3, 1, "--fsync", "never")
    try:
        yield c
    finally:
        c.down()


def _free_port() -> int:
    return pick_free_ports(1)[0]


def _rss_kb(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


def _quorum(cluster: LocalCluster) -> tuple[int, int]:
    q = cluster.call("DescribeQuorum", {})
    return q["leader_id"], q["term"]


def _unchanged_for(what: Any, seconds: float, expected: Any) -> None:
    """``what()`` keeps returning ``expected`` for ``seconds`` (an election would change it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert what() == expected
        time.sleep(0.2)


def _blast(port: int, data: bytes, host: str = "127.0.0.1") -> tuple[int, bool]:
    """Send ``data``; (bytes the peer took, whether it closed the connection within 10 s)."""
    sent, closed = 0, False
    with socket.create_connection((host, port), timeout=30) as s:
        view = memoryview(data)
        try:
            while sent < len(data):
                sent += s.send(view[sent : sent + (1 << 20)])
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        if not closed:
            s.settimeout(10)
            try:
                closed = s.recv(1) == b""
            except ConnectionResetError:
                closed = True
            except TimeoutError:
                closed = False
    return sent, closed


class _Evil:
    """Unpickling this creates ``path``: proof that code ran."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


def _pickle_frames(marker: Path) -> bytes:
    """PySyncObj-shaped frames (i32 length | zlib(pickle)): a handshake value and an
    append_entries, both of which create ``marker`` when unpickled."""
    frames = b""
    for obj in (
        _Evil(marker),
        {"type": "append_entries", "term": 99, "entries": [(_Evil(marker), 1, 99)]},
    ):
        data = zlib.compress(pickle.dumps(obj))
        frames += struct.pack("i", len(data)) + data
    return frames + pickle.dumps(_Evil(marker))  # and a bare pickle after them


# ---- defaults and the Raft port ------------------------------------------------------------


def test_cluster_up_writes_a_private_raft_secret_and_requires_rpc_auth(cluster) -> None:
    meta = cluster.meta
    secret = Path(meta["raft_secret"])
    assert secret.stat().st_mode & 0o777 == 0o600
    assert len(base64.b64decode(secret.read_text().strip())) >= 32
    for c in meta["controllers"]:
        assert load_properties(c["config"])["controller.raft.secret.file"] == str(secret)
    c1 = cluster.controller(1)
    with pytest.raises(KraftError) as info:
        call_sync([(c1["host"], c1["rpc_port"])], "ListTopics", {}, 10)
    assert info.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert cluster.call("ListTopics", {})["topics"] is not None  # with the admin credentials


def test_a_pickle_sent_to_a_raft_port_is_not_executed(cluster, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    before = _quorum(cluster)
    for c in cluster.meta["controllers"]:
        _, closed = _blast(c["raft_port"], _pickle_frames(marker))
        assert closed, "the controller kept a connection that sent unencrypted pickles"
    assert not marker.exists()
    assert _quorum(cluster) == before


def test_a_64_mib_frame_of_zeros_is_cut_off_without_an_election(cluster) -> None:
    leader, term = _quorum(cluster)
    port = cluster.controller(leader)["raft_port"]
    pid = cluster.controller(leader)["pid"]
    rss_before = _rss_kb(pid)
    for data in (
        bytes(64 << 20),  # announces a 0-byte frame, then zeros
        bytes(64 << 20),
        struct.pack("i", 64 << 20) + bytes(64 << 20),  # announces 64 MiB before authenticating
    ):
        sent, closed = _blast(port, data)
        assert closed and sent < len(data), (sent, closed)
    _unchanged_for(lambda: _quorum(cluster), 3.0, (leader, term))
    growth_mb = (_rss_kb(pid) - rss_before) / 1024
    print(f"leader RSS growth after three 64 MiB frames: {growth_mb:.1f} MB")
    assert growth_mb < 32


def test_a_half_sent_raft_frame_and_a_silent_connection_are_closed(cluster) -> None:
    port = cluster.controller(1)["raft_port"]
    half = socket.create_connection(("127.0.0.1", port), timeout=20)
    silent = socket.create_connection(("127.0.0.1", port), timeout=20)
    started = time.monotonic()
    try:
        half.sendall(struct.pack("i", 1000) + b"x" * 10)
        for s in (half, silent):
            try:
                assert s.recv(1) == b""
            except ConnectionResetError:
                pass
        elapsed = time.monotonic() - started
    finally:
        half.close()
        silent.close()
    assert 4.0 <= elapsed <= 12.0, elapsed


# ---- controller RPC: broker APIs and on_behalf_of ------------------------------------------


def _broker_epoch(cluster: LocalCluster, broker_id: int = 101) -> dict:
    brokers = cluster.call("DescribeCluster", {})["brokers"]
    return next(b for b in brokers if b["broker_id"] == broker_id)


def test_broker_apis_need_a_broker_principal(cluster) -> None:
    broker = poll(
        lambda: (lambda b: b if not b["fenced"] else None)(_broker_epoch(cluster)),
        60,
        what="broker 101 unfenced",
    )
    epoch = broker["epoch"]
    spoofed = {
        "BrokerHeartbeat": {
            "broker_id": 101,
            "broker_epoch": epoch,
            "metadata_offset": 0,
            "want_fence": True,
            "want_shutdown": True,
        },
        "AlterPartition": {"broker_id": 101, "broker_epoch": epoch, "topics": []},
        "AllocateProducerIds": {"broker_id": 101, "broker_epoch": epoch},
        "UnregisterBroker": {"broker_id": 101},
        "BrokerRegistration": {
            "broker_id": 101,
            "cluster_id": cluster.meta["cluster_id"],
            "incarnation_id": "00000000-0000-0000-0000-000000000000",
            "listeners": [],
        },
    }
    for api, body in spoofed.items():
        with pytest.raises(KraftError) as info:
            cluster.call(api, body)
        assert info.value.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED, (api, info.value)
    after = _broker_epoch(cluster)
    assert not after["fenced"] and after["epoch"] == epoch


def _call_as(cluster: LocalCluster, user: str, api: str, body: dict, **kw: Any) -> dict:
    import trio

    c = cluster.controller(cluster.active_controller())

    async def main() -> dict:
        client = ControllerClient(
            [(c["host"], c["rpc_port"])], credentials=cluster.credentials(user)
        )
        try:
            return await client.call(api, body, timeout=20, **kw)
        finally:
            await client.aclose()

    return trio.run(main)


def _provenance_since(cluster: LocalCluster, offset: int, api: str) -> list[Any]:
    """Provenance of the batches written by ``api`` at or after ``offset`` (active controller)."""
    out: list[Any] = []
    while True:
        fetched = cluster.call("FetchMetadata", {"from_offset": offset, "max_wait_ms": 0})
        batches = [decode_batch(b) for b in fetched["batches"]]
        out += [b.provenance for b in batches if b.provenance.api == api]
        if not batches:
            return out
        offset = batches[-1].base_offset + len(batches[-1].records)


def _log_end(cluster: LocalCluster) -> int:
    return cluster.call("FetchMetadata", {"from_offset": 0, "max_wait_ms": 0})["high_watermark"]


def test_on_behalf_of_is_accepted_from_brokers_only(cluster) -> None:
    create = {"topics": [{"name": "behalf", "num_partitions": 1, "replication_factor": 1}]}
    for user, who in (("admin", "User:alice"), ("broker", "User:ANONYMOUS")):
        with pytest.raises(KraftError) as info:
            _call_as(cluster, user, "CreateTopics", create, on_behalf_of=who)
        assert info.value.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    with pytest.raises(KraftError) as info:
        _call_as(
            cluster,
            "broker",
            "AllocateProducerIds",
            {"broker_id": 101, "broker_epoch": 1},
            on_behalf_of="User:alice",
        )
    assert info.value.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    start = _log_end(cluster)
    result = _call_as(cluster, "broker", "CreateTopics", create, on_behalf_of="User:alice")
    assert result["topics"][0]["error_code"] == 0
    creates = poll(
        lambda: _provenance_since(cluster, start, "CreateTopics"), 30, what="the CreateTopics"
    )
    assert [p.principal for p in creates] == ["User:alice"]


# ---- Kafka listeners -------------------------------------------------------------------------


def test_an_anonymous_kafka_client_cannot_create_or_delete_topics(cluster) -> None:
    admin_mod = pytest.importorskip("confluent_kafka.admin")
    from confluent_kafka import KafkaException

    kraft("topics", "create", "keep-me", "--cluster", str(cluster.dir))
    b = cluster.meta["brokers"][0]
    admin = admin_mod.AdminClient({"bootstrap.servers": f"{b['host']}:{b['port']}"})
    futures = list(admin.create_topics([admin_mod.NewTopic("anon-made", 1, 1)]).values())
    futures += list(admin.delete_topics(["keep-me"]).values())
    for future in futures:
        with pytest.raises(KafkaException) as info:
            future.result(timeout=30)
        assert info.value.args[0].code() == ErrorCode.CLUSTER_AUTHORIZATION_FAILED, info.value
    names = {t["name"] for t in cluster.call("ListTopics", {})["topics"]}
    assert "keep-me" in names and "anon-made" not in names


@pytest.fixture(scope="module")
def sasl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("sasl")
    c = LocalCluster(tmp / "c")
    c.up(1, 1, "--fsync", "never")
    try:
        users = tmp / "kafka-users"
        users.write_text(f"alice:{hash_password('alice-pw', iterations=1000)}\n")
        yield c, c.use_sasl_listener(101, users, **{"max.connections.per.ip": "50"})
    finally:
        c.down()


def test_a_sasl_client_admin_request_runs_as_the_client(sasl_cluster) -> None:
    admin_mod = pytest.importorskip("confluent_kafka.admin")
    c, b = sasl_cluster
    admin = admin_mod.AdminClient(
        {
            "bootstrap.servers": f"127.0.0.1:{b['port']}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": "alice-pw",
        }
    )
    start = _log_end(c)
    for future in admin.create_topics([admin_mod.NewTopic("by-alice", 1, 1)]).values():
        future.result(timeout=30)
    creates = poll(lambda: _provenance_since(c, start, "CreateTopics"), 30, what="CreateTopics")
    assert creates[-1].principal == "User:alice"  # not the broker's User:broker
    assert creates[-1].client_id.endswith("@broker-101")


def test_huge_frames_before_sasl_login_are_refused_unread(sasl_cluster) -> None:
    _, b = sasl_cluster
    pid = b["pid"]
    before = _rss_kb(pid)
    header = struct.pack(">i", 100 << 20)  # 100 MiB announced before authenticating
    for _ in range(6):
        sent, closed = _blast(b["port"], header + bytes(16 << 20))
        assert closed and sent < len(header) + (16 << 20), (sent, closed)
    growth_mb = (_rss_kb(pid) - before) / 1024
    print(f"broker RSS growth after six 100 MiB pre-auth frames: {growth_mb:.1f} MB")
    assert growth_mb < 20


def _api_versions(port: int, source: str) -> bool:
    """An ApiVersions v0 round trip from ``source`` (a loopback address) to the broker."""
    with socket.socket() as s:
        s.settimeout(10)
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        client_id = b"probe"
        body = struct.pack(">hhih", 18, 0, 7, len(client_id)) + client_id
        s.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        answer = s.recv(size, socket.MSG_WAITALL)
        return struct.unpack(">i", answer[:4])[0] == 7


def test_kafka_connections_per_ip_are_capped(sasl_cluster) -> None:
    _, b = sasl_cluster
    held = [socket.create_connection(("127.0.0.1", b["port"]), timeout=10) for _ in range(60)]
    try:

        def refused() -> int:
            count = 0
            for s in held:
                s.setblocking(False)
                try:
                    count += s.recv(1) == b""
                except BlockingIOError:
                    pass
                except ConnectionResetError:
                    count += 1
            return count

        poll(lambda: refused() >= 10, 5, what="the 10 connections over the limit refused")
        assert refused() == 10  # the other 50 stay until their login deadline (10 s)
        assert _api_versions(b["port"], "127.0.0.2")
    finally:
        for s in held:
            s.close()


# ---- controller RPC availability ---------------------------------------------------------------


def _authenticated_list_topics(port: int, source: str, creds: Any) -> dict:
    """SaslAuthenticate then ListTopics over one raw connection bound to ``source``."""
    with socket.socket() as s:
        s.settimeout(10)
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(
            encode_frame(
                {
                    "api": "SaslAuthenticate",
                    "version": 0,
                    "correlation_id": 1,
                    "body": creds.handshake_body(),
                }
            )
            + encode_frame({"api": "ListTopics", "version": 0, "correlation_id": 2, "body": {}})
        )
        decoder, answers = FrameDecoder(8 << 20), []
        while len(answers) < 2:
            data = s.recv(65536)
            assert data, "connection closed"
            answers += decoder.feed(data)
        assert answers[0]["error_code"] == 0, answers[0]
        return answers[1]


def test_an_idle_connection_flood_from_one_address_locks_nobody_else_out(cluster) -> None:
    c = cluster.controller(1)
    flood: list[socket.socket] = []
    try:
        for _ in range(1100):
            flood.append(socket.create_connection(("127.0.0.1", c["rpc_port"]), timeout=10))
        started = time.monotonic()
        answer = _authenticated_list_topics(c["rpc_port"], "127.0.0.2", cluster.credentials())
        assert answer["error_code"] == 0 and time.monotonic() - started < 5

        def closed_count() -> int:
            count = 0
            for s in flood:
                s.setblocking(False)
                try:
                    count += s.recv(1) == b""
                except BlockingIOError:
                    pass
                except ConnectionResetError:
                    count += 1
            return count

        # 100 over max.connections.per.ip at once; the rest, unauthenticated, within the
        # io timeout (10 s) instead of the 600 s idle timeout
        poll(lambda: closed_count() == len(flood) or None, 30, what="every idle one closed")
    finally:
        for s in flood:
            s.close()


# ---- refusing to start -----------------------------------------------------------------------


def _run_node(role: str, config: Path, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.cli", role, "--config", str(config)],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _controller_props(tmp_path: Path, rpc_host: str = "127.0.0.1") -> dict[str, str]:
    return {
        "node.id": "1",
        "process.roles": "controller",
        "cluster.id": "c",
        "controller.quorum.voters": f"1@{rpc_host}:{_free_port()}",
        "controller.quorum.raft.voters": f"1@127.0.0.1:{_free_port()}",
        "metadata.log.dir": str(tmp_path / "meta"),
    }


def test_nodes_refuse_insecure_setups_with_a_clear_message(tmp_path: Path) -> None:
    config = tmp_path / "controller.properties"
    write_properties(config, _controller_props(tmp_path))
    proc = _run_node("controller", config)
    assert proc.returncode != 0 and "controller.raft.secret.file is not set" in proc.stderr
    assert "Traceback" not in proc.stderr

    secret = tmp_path / "raft.secret"
    secret.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    secret.chmod(0o600)
    props = dict(
        _controller_props(tmp_path, "0.0.0.0"), **{"controller.raft.secret.file": str(secret)}
    )
    write_properties(config, props)
    proc = _run_node("controller", config)
    assert proc.returncode != 0 and "allow.insecure.listeners" in proc.stderr, proc.stderr
    assert "controller.rpc.auth.credentials.file" in proc.stderr

    # allowed on purpose: it starts and serves (no warning-free silent default any more)
    write_properties(config, dict(props, **{"allow.insecure.listeners": "true"}))
    kraft("storage", "format", "--config", str(config), "--initial-controllers")
    rpc_port = int(props["controller.quorum.voters"].rpartition(":")[2])
    node = subprocess.Popen(
        [sys.executable, "-m", "tools.cli", "controller", "--config", str(config)],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        poll(
            lambda: call_sync([("127.0.0.1", rpc_port)], "ListTopics", {}, 2),
            60,
            what="the insecure-by-choice controller to serve",
        )
    finally:
        node.kill()
        node.wait(10)

    broker = tmp_path / "broker.properties"
    write_properties(
        broker,
        {
            "node.id": "101",
            "process.roles": "broker",
            "cluster.id": "c",
            "listeners": f"PLAINTEXT://0.0.0.0:{_free_port()}",
            "log.dirs": str(tmp_path / "data"),
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{rpc_port}",
        },
    )
    kraft("storage", "format", "--config", str(broker))
    proc = _run_node("broker", broker)
    assert proc.returncode != 0 and "allow.insecure.listeners=true" in proc.stderr, proc.stderr
    assert "PLAINTEXT://0.0.0.0" in proc.stderr and "Traceback" not in proc.stderr


def test_no_auth_warns_auth_is_accepted_and_old_directories_get_a_secret(tmp_path: Path) -> None:
    plain = LocalCluster(tmp_path / "plain")
    try:
        proc = kraft(
            "cluster",
            "up",
            "--dir",
            str(plain.dir),
            "--controllers",
            "1",
            "--detach",
            "--no-auth",
            timeout=120,
        )
        assert "Warning: --no-auth" in proc.stderr
        assert "auth_dir" not in plain.meta and Path(plain.meta["raft_secret"]).is_file()
        c = plain.controller(1)
        assert call_sync([(c["host"], c["rpc_port"])], "ListTopics", {}, 10)["topics"] == []
        # a directory from before Raft secrets: no secret anywhere; start adds one
        plain.down()
        meta = plain.meta
        Path(meta.pop("raft_secret")).unlink()
        (plain.dir / "cluster.json").write_text(json.dumps(meta))
        props = load_properties(c["config"])
        del props["controller.raft.secret.file"]
        write_properties(c["config"], props)
        plain.start()
        assert Path(plain.meta["raft_secret"]).stat().st_mode & 0o777 == 0o600
        assert (
            load_properties(c["config"])["controller.raft.secret.file"] == plain.meta["raft_secret"]
        )
        assert call_sync([(c["host"], c["rpc_port"])], "ListTopics", {}, 10)["topics"] == []
    finally:
        plain.down()
    compat = LocalCluster(tmp_path / "compat")
    try:
        proc = kraft(
            "cluster",
            "up",
            "--dir",
            str(compat.dir),
            "--controllers",
            "1",
            "--detach",
            "--auth",
            timeout=120,
        )
        assert "Warning" not in proc.stderr and compat.meta["auth_dir"]
        assert compat.call("ListTopics", {})["topics"] == []
    finally:
        compat.down()
