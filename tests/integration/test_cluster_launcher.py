"""The local cluster launcher: ids, ports, config files, cluster.json, pid ownership, start/stop.

Real processes are used, but they are stand-in sleepers (``node_command`` is replaced), and
the controllers' answers come from a fake RPC call, so no controller code runs here.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.config import BrokerConfig
from kraft.config import ConfigError, ControllerConfig, load_properties
from tools import cli
from tools import cluster as launcher
from tools.cluster import ClusterError, Readiness

SLEEPER = "import sys, time; print('node up', sys.argv[1:], flush=True); time.sleep(120)"
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ignoring TERM', flush=True); time.sleep(120)"
)


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen]]:
    """Processes a test starts directly; killed and reaped at teardown."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


@pytest.fixture
def fake_nodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Nodes run a sleeper (or ``scripts[name]``) with the config path in their argv."""
    scripts: dict[str, str] = {}
    started: list[int] = []
    real_start = launcher.start_node

    def command(node: launcher.Node) -> list[str]:
        return [sys.executable, "-c", scripts.get(node.name, SLEEPER), "--config", node.config]

    def start(node: launcher.Node) -> subprocess.Popen:
        proc = real_start(node)
        started.append(proc.pid)
        return proc

    monkeypatch.setattr(launcher, "node_command", command)
    monkeypatch.setattr(launcher, "start_node", start)
    yield scripts
    for pid in started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class FakeControllers:
    """Answers DescribeQuorum/DescribeCluster like a healthy cluster."""

    def __init__(self, leader: int = 1, unfenced: tuple[int, ...] = ()) -> None:
        self.leader = leader
        self.unfenced = set(unfenced)
        self.calls: list[tuple[list[tuple[str, int]], str]] = []

    def __call__(
        self, bootstrap: list[tuple[str, int]], api: str, body: dict, timeout: float
    ) -> dict:
        self.calls.append((bootstrap, api))
        if api == "DescribeQuorum":
            return {
                "leader_id": self.leader,
                "term": 2,
                "commit_index": 5,
                "high_watermark": 5,
                "voters": [],
                "observers": [],
            }
        if api == "DescribeCluster":
            return {"brokers": [{"broker_id": b, "state": "unfenced"} for b in self.unfenced]}
        raise AssertionError(api)


def alive(pid: int | None, config: str) -> bool:
    return launcher.pid_owned(pid, config)


# ---- ids, ports, layout -----------------------------------------------------------------------


def test_cluster_id_is_kafka_style() -> None:
    ids = {launcher.new_cluster_id() for _ in range(50)}
    assert len(ids) == 50
    for cid in ids:
        assert len(cid) == 22
        assert set(cid) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


def test_pick_free_ports_are_distinct_and_bindable() -> None:
    ports = launcher.pick_free_ports(12)
    assert len(set(ports)) == 12
    for p in ports:
        assert 0 < p < 65536
    assert all(launcher.port_is_free(p) for p in ports[:3])


def test_ports_from_base_refuses_busy_ports() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        with pytest.raises(ClusterError, match=str(busy)):
            launcher.ports_from_base(busy, 2)
    with pytest.raises(ClusterError):
        launcher.ports_from_base(65535, 4)


def test_plan_cluster_ids_ports_paths_racks(tmp_path: Path) -> None:
    layout = launcher.plan_cluster(tmp_path / "c", 3, 4, racks=["r1", "r2"], fsync="never")
    assert [c.id for c in layout.controllers] == [1, 2, 3]
    assert [b.id for b in layout.brokers] == [101, 102, 103, 104]
    assert [b.rack for b in layout.brokers] == ["r1", "r2", "r1", "r2"]
    ports = [p for c in layout.controllers for p in (c.rpc_port, c.raft_port)] + [
        p for b in layout.brokers for p in (b.port, b.admin_port)
    ]
    assert len(set(ports)) == len(ports) == 14
    c1, b1 = layout.controllers[0], layout.brokers[0]
    assert Path(c1.config) == (tmp_path / "c" / "controller-1" / "controller.properties").resolve()
    assert Path(b1.config) == (tmp_path / "c" / "broker-101" / "broker.properties").resolve()
    assert Path(b1.log_file).name == "node.log" and Path(c1.metadata_dir).is_absolute()
    assert all(n.pid is None for n in layout.nodes())
    assert layout.node(102) is layout.brokers[1]
    with pytest.raises(ClusterError):
        layout.node(7)
    with pytest.raises(ClusterError):
        launcher.plan_cluster(tmp_path, 0)


def test_plan_cluster_with_base_port(tmp_path: Path) -> None:
    base = launcher.pick_free_ports(1)[0]
    try:
        layout = launcher.plan_cluster(tmp_path, 2, 1, base_port=base)
    except ClusterError:
        pytest.skip("a port right after the picked one is in use")
    assert [(c.rpc_port, c.raft_port) for c in layout.controllers] == [
        (base, base + 1),
        (base + 2, base + 3),
    ]
    assert (layout.brokers[0].port, layout.brokers[0].admin_port) == (base + 4, base + 5)
    assert layout.brokers[0].rack is None


# ---- config files ----------------------------------------------------------------------------


def test_generated_configs_are_valid_node_configs(tmp_path: Path) -> None:
    layout = launcher.plan_cluster(tmp_path, 3, 2, racks=["a", "b"], fsync="never")
    assert launcher.ensure_raft_secret(layout, tmp_path)
    launcher.write_node_configs(layout)
    secret = Path(layout.raft_secret or "")
    assert secret.stat().st_mode & 0o777 == 0o600 and len(secret.read_text().strip()) >= 43
    for c in layout.controllers:
        props = load_properties(c.config)
        assert props["process.roles"] == "controller"
        assert props["controller.raft.secret.file"] == str(secret)
        assert props["metadata.log.fsync"] == "never"
        cfg = ControllerConfig.from_properties(props, env={})
        assert cfg.node_id == c.id and cfg.cluster_id == layout.cluster_id
        assert cfg.rpc_voters == {x.id: ("127.0.0.1", x.rpc_port) for x in layout.controllers}
        assert cfg.raft_voters == {x.id: ("127.0.0.1", x.raft_port) for x in layout.controllers}
        assert cfg.metadata_dir == Path(c.metadata_dir) and cfg.metadata_dir.is_dir()
    for b in layout.brokers:
        props = load_properties(b.config)
        cfg = BrokerConfig.from_properties(props)
        assert cfg.node_id == b.id and cfg.cluster_id == layout.cluster_id
        assert cfg.listener == ("PLAINTEXT", "127.0.0.1", b.port)
        assert cfg.bootstrap == layout.controller_endpoints()
        assert cfg.rack == b.rack and cfg["broker.admin.port"] == b.admin_port
        assert cfg.log_dirs == [Path(b.log_dirs)] and Path(b.log_dirs).is_dir()


def test_broker_without_rack_has_no_rack_key(tmp_path: Path) -> None:
    layout = launcher.plan_cluster(tmp_path, 1, 1)
    assert "broker.rack" not in launcher.broker_properties(layout, layout.brokers[0])


# ---- cluster.json -----------------------------------------------------------------------------


def test_cluster_json_round_trip_and_shape(tmp_path: Path) -> None:
    layout = launcher.plan_cluster(tmp_path, 2, 1, racks=["x"])
    layout.controllers[0].pid = 1234
    launcher.write_cluster_json(tmp_path, layout)
    assert [p.name for p in tmp_path.iterdir()] == ["cluster.json"]
    doc = json.loads((tmp_path / "cluster.json").read_text())
    assert {"cluster_id", "controllers", "brokers"} <= set(doc)
    assert set(doc["controllers"][0]) == {
        "id",
        "host",
        "rpc_port",
        "raft_port",
        "pid",
        "config",
        "metadata_dir",
        "log_file",
    }
    assert {"id", "host", "port", "pid", "config", "log_dirs", "rack", "log_file"} <= set(
        doc["brokers"][0]
    )
    assert launcher.read_cluster_json(tmp_path) == layout


def test_read_cluster_json_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        launcher.read_cluster_json(tmp_path)
    (tmp_path / "cluster.json").write_text("{not json")
    with pytest.raises(ClusterError, match="not a valid cluster file"):
        launcher.read_cluster_json(tmp_path)
    (tmp_path / "cluster.json").write_text('{"controllers": []}')
    with pytest.raises(ClusterError):
        launcher.read_cluster_json(tmp_path)


def test_update_pid(tmp_path: Path) -> None:
    launcher.write_cluster_json(tmp_path, launcher.plan_cluster(tmp_path, 1, 1))
    launcher.update_pid(tmp_path, 101, 4242)
    assert launcher.read_cluster_json(tmp_path).node(101).pid == 4242


# ---- pid ownership ----------------------------------------------------------------------------


def test_pid_owned_checks_the_command_line(spawned: list[subprocess.Popen], tmp_path: Path) -> None:
    config = str(tmp_path / "controller.properties")
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, "--config", config])
    spawned.append(proc)
    assert launcher.wait_until(lambda: config in (launcher.pid_cmdline(proc.pid) or []), 10)
    assert launcher.pid_owned(proc.pid, config)
    assert not launcher.pid_owned(proc.pid, config + ".other")
    assert not launcher.pid_owned(os.getpid(), config)
    assert not launcher.pid_owned(None, config) and not launcher.pid_owned(0, config)
    proc.kill()  # not reaped yet: a zombie must not count as our node
    assert launcher.wait_until(lambda: not launcher.pid_owned(proc.pid, config), 10)
    proc.wait(timeout=10)
    assert not launcher.pid_owned(proc.pid, config)


def test_pid_cmdline_of_missing_process_is_none() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=10)
    assert launcher.pid_cmdline(proc.pid) is None


# ---- starting and stopping --------------------------------------------------------------------


def test_start_node_detaches_and_logs(fake_nodes: dict[str, str], tmp_path: Path) -> None:
    layout = launcher.plan_cluster(tmp_path, 1)
    node = layout.controllers[0]
    proc = launcher.start_node(node)
    try:
        assert node.pid == proc.pid
        assert os.getsid(proc.pid) == proc.pid  # its own session: Ctrl-C does not reach it
        assert launcher.wait_until(lambda: "node up" in launcher.log_tail(node), 10)
        assert launcher.log_tail(node).startswith("==== kraft cluster: starting controller-1")
        assert launcher.node_alive(node)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_real_node_command_runs_the_cli() -> None:
    node = launcher.ControllerNode(1, "127.0.0.1", 1, 2, None, "/d/c.properties", "/d/m", "/d/l")
    assert launcher.node_command(node)[1:] == [
        "-m",
        "tools.cli",
        "controller",
        "--config",
        "/d/c.properties",
    ]


def test_stop_nodes_terms_then_kills_stragglers(fake_nodes: dict[str, str], tmp_path: Path) -> None:
    layout = launcher.plan_cluster(tmp_path, 2, 1)
    fake_nodes["controller-2"] = STUBBORN
    children = {n.id: launcher.start_node(n) for n in layout.nodes()}
    stubborn = layout.node(2)
    assert launcher.wait_until(lambda: "ignoring TERM" in launcher.log_tail(stubborn), 10)
    results = launcher.stop_cluster(layout, timeout=1.0, children=children)
    assert [(r.node.id, r.outcome) for r in results] == [
        (101, "stopped"),
        (1, "stopped"),
        (2, "killed"),
    ]
    assert launcher.running_nodes(layout) == []
    again = launcher.stop_cluster(layout, timeout=1.0, children=children)
    assert {r.outcome for r in again} == {"not running"}


def test_signal_node_refuses_a_pid_that_is_not_ours(
    tmp_path: Path, spawned: list[subprocess.Popen]
) -> None:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, "--config", "/some/other"])
    spawned.append(proc)
    node = launcher.plan_cluster(tmp_path, 1).controllers[0]
    node.pid = proc.pid
    assert not launcher.signal_node(node, signal.SIGTERM)
    assert proc.poll() is None


# ---- readiness ------------------------------------------------------------------------------------


def test_readiness_rules() -> None:
    assert not Readiness().ready
    assert Readiness(controllers_with_leader={2}).ready
    assert not Readiness(controllers_with_leader={2}, required_brokers={101}).ready
    assert Readiness(controllers_with_leader={2}, required_brokers={101}, unfenced={101, 102}).ready
    assert not Readiness(controllers_with_leader={2}, required_controllers={1, 2}).ready
    assert "no leader yet" in Readiness().summary()


def test_probe_tolerates_unreachable_controllers(tmp_path: Path) -> None:
    layout = launcher.plan_cluster(tmp_path, 3, 1)
    down_port = layout.controllers[0].rpc_port

    def call(bootstrap: list[tuple[str, int]], api: str, body: dict, timeout: float) -> dict:
        if bootstrap == [("127.0.0.1", down_port)]:
            raise OSError("connection refused")
        return FakeControllers(leader=3, unfenced=(101,))(bootstrap, api, body, timeout)

    state = launcher.probe(layout, Readiness(required_brokers={101}), call)
    assert state.ready and state.leader_id == 3 and state.controllers_with_leader == {2, 3}
    assert "controller-1" in state.last_error


def test_wait_ready_times_out_with_a_summary(tmp_path: Path) -> None:
    layout = launcher.plan_cluster(tmp_path, 1, 1)
    with pytest.raises(ClusterError, match=r"not ready after 0.3s: .*brokers unfenced: 0/1"):
        launcher.wait_ready(
            layout, 0.3, {}, required_brokers={101}, call=FakeControllers(), interval=0.05
        )


def test_wait_ready_fails_fast_when_a_node_exits(
    fake_nodes: dict[str, str], tmp_path: Path
) -> None:
    layout = launcher.plan_cluster(tmp_path, 1)
    fake_nodes["controller-1"] = "import sys; print('bad config: node.id'); sys.exit(2)"
    children = {1: launcher.start_node(layout.controllers[0])}
    with pytest.raises(ClusterError, match=r"(?s)controller-1 exited with code 2.*bad config"):
        launcher.wait_ready(layout, 30, children, call=FakeControllers(leader=-1))


# ---- the cluster commands end to end (stand-in nodes) ----------------------------------------------


def _fake_controllers(monkeypatch: pytest.MonkeyPatch, fake: FakeControllers) -> None:
    """Readiness probes answered by ``fake``, with or without RPC credentials."""
    monkeypatch.setattr(launcher, "_default_call", fake)
    monkeypatch.setattr(launcher, "_authenticated_call", lambda credentials: fake)


def test_up_detach_status_kill_start_down(
    fake_nodes: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    _fake_controllers(monkeypatch, FakeControllers(1, unfenced=(101, 102)))
    d = str(tmp_path / "c")
    code = cli.main(
        [
            "cluster",
            "up",
            "--dir",
            d,
            "--controllers",
            "3",
            "--brokers",
            "2",
            "--racks",
            "a,b",
            "--detach",
            "--fsync",
            "never",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Ready: quorum: leader 1 (term 2); brokers unfenced: 2/2." in out
    layout = launcher.read_cluster_json(Path(d))
    assert all(launcher.node_alive(n) for n in layout.nodes())
    assert load_properties(layout.node(102).config)["broker.rack"] == "b"

    assert cli.main(["cluster", "up", "--dir", d, "--controllers", "3", "--brokers", "2"]) == 1
    assert "already running" in capsys.readouterr().err

    assert cli.main(["cluster", "status", "--dir", d, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cluster_id"] == layout.cluster_id
    assert [(c["id"], c["alive"]) for c in doc["controllers"]] == [(1, True), (2, True), (3, True)]

    old_pid = layout.node(101).pid
    assert cli.main(["cluster", "kill", "--dir", d, "--node", "101"]) == 0
    assert "broker-101 exited." in capsys.readouterr().out
    assert cli.main(["cluster", "kill", "--dir", d, "--node", "101"]) == 1
    assert "broker-101 is not running" in capsys.readouterr().err
    assert cli.main(["cluster", "status", "--dir", d]) == 0
    assert "4/5 node(s) running" in capsys.readouterr().out

    assert cli.main(["cluster", "start", "--dir", d, "--node", "101", "--wait"]) == 0
    out = capsys.readouterr().out
    restarted = launcher.read_cluster_json(Path(d)).node(101)
    assert restarted.pid != old_pid and launcher.node_alive(restarted)
    assert "Started broker-101" in out and "Ready:" in out
    assert restarted.port == layout.node(101).port  # same ports after a restart
    assert cli.main(["cluster", "start", "--dir", d, "--node", "101"]) == 1
    assert cli.main(["cluster", "start", "--dir", d]) == 0
    assert "Every node is already running." in capsys.readouterr().out

    assert cli.main(["cluster", "down", "--dir", d, "--timeout", "5", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)["nodes"]
    assert [(r["id"], r["result"]) for r in results] == [
        (101, "stopped"),
        (102, "stopped"),
        (1, "stopped"),
        (2, "stopped"),
        (3, "stopped"),
    ]
    after = launcher.read_cluster_json(Path(d))
    assert all(n.pid is None for n in after.nodes())

    # a stopped cluster of the same shape is restarted with the same id and ports
    assert (
        cli.main(["cluster", "up", "--dir", d, "--controllers", "3", "--brokers", "2", "--detach"])
        == 0
    )
    again = launcher.read_cluster_json(Path(d))
    assert again.cluster_id == layout.cluster_id
    assert [n.config for n in again.nodes()] == [n.config for n in layout.nodes()]
    assert cli.main(["cluster", "up", "--dir", d, "--controllers", "1", "--detach"]) == 1
    assert cli.main(["cluster", "down", "--dir", d]) == 0


def test_up_foreground_stops_every_node_on_interrupt(
    fake_nodes: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    from tools.commands import cluster_cmd

    _fake_controllers(monkeypatch, FakeControllers(2))
    seen: dict[str, Any] = {}

    def interrupt(children: dict, layout: launcher.ClusterLayout) -> None:
        deadline = time.monotonic() + 10  # a loaded machine may still be starting a node
        while True:
            seen["alive"] = [launcher.node_alive(n) for n in layout.nodes()]
            if all(seen["alive"]) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster_cmd, "_monitor", interrupt)
    d = tmp_path / "fg"
    assert (
        cli.main(["cluster", "up", "--dir", str(d), "--controllers", "2", "--stop-timeout", "5"])
        == 0
    )
    err = capsys.readouterr().err
    assert seen["alive"] == [True, True]
    assert "Stopping the cluster" in err
    layout = launcher.read_cluster_json(d)
    assert all(n.pid is None for n in layout.nodes())
    assert signal.getsignal(signal.SIGTERM) is not signal.default_int_handler


def test_up_failure_stops_the_started_nodes(
    fake_nodes: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    _fake_controllers(monkeypatch, FakeControllers(leader=-1))
    fake_nodes["controller-2"] = "import sys; print('cannot bind'); sys.exit(1)"
    d = tmp_path / "bad"
    assert (
        cli.main(
            [
                "cluster",
                "up",
                "--dir",
                str(d),
                "--controllers",
                "3",
                "--detach",
                "--stop-timeout",
                "5",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "controller-2 exited with code 1" in err and "cannot bind" in err
    assert launcher.running_nodes(launcher.read_cluster_json(d)) == []


def test_cluster_commands_without_a_cluster(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for words in (["down"], ["status"], ["start"], ["kill", "--node", "1"]):
        assert cli.main(["cluster", *words, "--dir", str(tmp_path / "none")]) == 1
        assert not (tmp_path / "none").exists()
        capsys.readouterr()
        assert cli.main(["cluster", *words, "--dir", str(tmp_path)]) == 1
        assert "no cluster in" in capsys.readouterr().err
    assert (
        cli.main(["cluster", "up", "--dir", str(tmp_path), "--controllers", "1", "--racks", "a"])
        == 2
    )


def _secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "raft.secret"
    path.write_text("a-test-raft-secret-of-at-least-32-bytes\n")
    path.chmod(0o600)
    return path


def test_fetch_linger_defaults_to_20_ms_and_is_bounded(tmp_path: Path) -> None:
    props = {
        "node.id": "1",
        "process.roles": "controller",
        "cluster.id": "c",
        "controller.quorum.voters": "1@127.0.0.1:9000",
        "controller.quorum.raft.voters": "1@127.0.0.1:9001",
        "metadata.log.dir": str(tmp_path),
        "controller.raft.secret.file": str(_secret_file(tmp_path)),
    }
    assert ControllerConfig.from_properties(props, env={})["metadata.fetch.linger.ms"] == 20
    assert (
        ControllerConfig.from_properties(dict(props, **{"metadata.fetch.linger.ms": "0"}), env={})[
            "metadata.fetch.linger.ms"
        ]
        == 0
    )
    for bad in ("-1", "1001"):
        with pytest.raises(ConfigError, match="metadata.fetch.linger.ms"):
            ControllerConfig.from_properties(
                dict(props, **{"metadata.fetch.linger.ms": bad}), env={}
            )


def test_group_commit_fill_defaults_to_2_ms_and_is_bounded(tmp_path: Path) -> None:
    props = {
        "node.id": "1",
        "process.roles": "controller",
        "cluster.id": "c",
        "controller.quorum.voters": "1@127.0.0.1:9000",
        "controller.quorum.raft.voters": "1@127.0.0.1:9001",
        "metadata.log.dir": str(tmp_path),
        "controller.raft.secret.file": str(_secret_file(tmp_path)),
    }
    key = "controller.group.commit.fill.ms"
    assert ControllerConfig.from_properties(props, env={})[key] == 2
    assert ControllerConfig.from_properties(dict(props, **{key: "0"}), env={})[key] == 0
    for bad in ("-1", "101"):
        with pytest.raises(ConfigError, match=key):
            ControllerConfig.from_properties(dict(props, **{key: bad}), env={})
