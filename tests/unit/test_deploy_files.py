"""The deployment files under deploy/ (docs/deploy.md): the compose file parses and starts
3 controllers + 3 brokers from properties files that exist and hold only known settings; the
example's files match the documented port plan."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from broker.config import BROKER_SETTINGS
from kraft.config import CONTROLLER_SETTINGS, load_properties

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KNOWN = {
    "controller": {s.key for s in CONTROLLER_SETTINGS},
    "broker": {s.key for s in BROKER_SETTINGS},
}


def _compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_starts_three_controllers_and_three_brokers_after_init() -> None:
    services = _compose()["services"]
    roles = {name: svc.get("command", [None])[0] for name, svc in services.items()}
    assert sorted(n for n, r in roles.items() if r == "controller") == [
        "controller-1",
        "controller-2",
        "controller-3",
    ]
    assert sorted(n for n, r in roles.items() if r == "broker") == [
        "broker-1",
        "broker-2",
        "broker-3",
    ]
    assert services["init"]["build"]["dockerfile"] == "deploy/Dockerfile"
    for name, role in roles.items():
        if role is None:
            continue
        svc = services[name]
        assert svc["depends_on"]["init"]["condition"] == "service_completed_successfully"
        assert svc["stop_signal"] == "SIGTERM"
        config = svc["command"][2]
        assert config.startswith("/opt/pykraft/")
        local = ROOT / config.removeprefix("/opt/pykraft/")
        props = load_properties(local)
        assert props["process.roles"] == role
        assert set(props) <= KNOWN[role], set(props) - KNOWN[role]
        assert svc["hostname"] == name


def test_compose_init_script_and_dockerfile_exist_and_agree() -> None:
    init = _compose()["services"]["init"]["entrypoint"][0]
    script = ROOT / init.removeprefix("/opt/pykraft/")
    assert script.is_file() and script.stat().st_mode & 0o111
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["kraft"]' in dockerfile and "COPY deploy ./deploy" in dockerfile
    assert "WORKDIR /opt/pykraft" in dockerfile


@pytest.mark.parametrize("host", [1, 2, 3])
def test_example_host_files_follow_the_port_plan(host: int) -> None:
    ip = f"127.0.0.{host + 1}"
    c = load_properties(DEPLOY / "example" / f"host{host}" / "controller.properties")
    b = load_properties(DEPLOY / "example" / f"host{host}" / "broker.properties")
    assert set(c) <= KNOWN["controller"] and set(b) <= KNOWN["broker"]
    assert c["node.id"] == str(host) and b["node.id"] == f"10{host}"
    assert c["cluster.id"] == b["cluster.id"]
    assert f"{host}@{ip}:9093" in c["controller.quorum.voters"]
    assert f"{host}@{ip}:9094" in c["controller.quorum.raft.voters"]
    assert b["listeners"] == f"CLIENT://{ip}:9092,REPLICATION://{ip}:9091"
    assert b["inter.broker.listener.name"] == "REPLICATION"
    assert b["replication.only.listeners"] == "REPLICATION"
    assert "REPLICATION:SASL_SSL" in b["listener.security.protocol.map"]
    assert b["min.insync.replicas"] == "2" and c["default.replication.factor"] == "3"
    for props in (c, b):
        for key, value in props.items():
            if key.endswith((".file", ".location", ".dir", ".dirs")):
                assert value.startswith("/"), (key, value)  # the rehearsal's root prefix rule


def test_compose_healthcheck_logs_in_to_the_admin_endpoint() -> None:
    for name, svc in _compose()["services"].items():
        if name.startswith("broker-"):
            check = " ".join(svc["healthcheck"]["test"])
            assert "10092" in check and "/etc/kraft/broker.credentials" in check
            compile(svc["healthcheck"]["test"][-1], name, "exec")  # the probe is valid Python
