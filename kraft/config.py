"""Node configuration: Kafka-style ``key=value`` properties files with typed, defaulted settings.

Every setting has a sane default so ``kraft cluster up`` needs no file. Names follow Kafka where
Kafka has the setting (``node.id``, ``controller.quorum.voters``, ``broker.session.timeout.ms``,
...). Unknown keys are refused with a clear error rather than ignored, so a typo never silently
falls back to a default.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kraft.logsetup import parse_level
from kraft.rpc.auth import AuthError, ClientCredentials, CredentialStore


class ConfigError(ValueError):
    """A configuration file or value that cannot be used; the message names the key."""


def load_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """Parse a properties file: ``key=value`` lines, ``#``/``!`` comments, blank lines."""
    props: dict[str, str] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if sep <= 0:
            raise ConfigError(f"{path}:{lineno}: expected key=value, got {raw!r}")
        props[line[:sep].strip()] = line[sep + 1 :].strip()
    return props


def write_properties(path: str | os.PathLike[str], props: dict[str, Any]) -> None:
    """Write ``props`` as a properties file (keys sorted, one per line)."""
    lines = [f"{k}={'' if v is None else v}" for k, v in sorted(props.items())]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def parse_voters(value: str, key: str) -> dict[int, tuple[str, int]]:
    """Parse ``id@host:port,...`` into ``{id: (host, port)}``."""
    voters: dict[int, tuple[str, int]] = {}
    for item in filter(None, (s.strip() for s in value.split(","))):
        try:
            node, _, addr = item.partition("@")
            host, _, port = addr.rpartition(":")
            voters[int(node)] = (host.strip("[]"), int(port))
        except ValueError:
            raise ConfigError(f"{key}: expected id@host:port entries, got {item!r}") from None
        if not host:
            raise ConfigError(f"{key}: missing host in {item!r}")
    if not voters:
        raise ConfigError(f"{key}: no voters given")
    return voters


def parse_hostports(value: str, key: str) -> list[tuple[str, int]]:
    """Parse ``host:port,...``."""
    out = []
    for item in filter(None, (s.strip() for s in value.split(","))):
        host, _, port = item.rpartition(":")
        try:
            out.append((host.strip("[]"), int(port)))
        except ValueError:
            raise ConfigError(f"{key}: expected host:port entries, got {item!r}") from None
    if not out:
        raise ConfigError(f"{key}: no endpoints given")
    return out


def parse_listener(value: str, key: str) -> tuple[str, str, int]:
    """Parse one ``NAME://host:port`` listener into (name, host, port)."""
    name, sep, addr = value.partition("://")
    host, _, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"{key}: expected NAME://host:port, got {value!r}")
    return name, host.strip("[]") or "0.0.0.0", int(port)


@dataclass(frozen=True)
class Setting:
    """One config key: how its value parses, its default (None = required) and what it does."""

    key: str
    parse: Callable[[str], Any]
    default: Any
    doc: str


def parse_bool(v: str) -> bool:
    """true/1/yes or false/0/no (any case)."""
    if v.lower() in ("true", "1", "yes"):
        return True
    if v.lower() in ("false", "0", "no"):
        return False
    raise ValueError("expected true or false")


def _log_level(v: str) -> str:
    parse_level(v, "log.level")
    return v.strip().upper()


def parse_positive(v: str) -> int:
    """An integer > 0."""
    n = int(v)
    if n <= 0:
        raise ValueError("expected a positive integer")
    return n


def _choice(*options: str) -> Callable[[str], str]:
    def parse(v: str) -> str:
        if v not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return v

    return parse


CLIENT_CREDENTIALS_KEY = "controller.rpc.client.credentials.file"
"""Where a node that calls controllers finds its RPC login (controllers and brokers alike)."""

COMMON_SETTINGS = [
    Setting("node.id", int, None, "this node's id (required)"),
    Setting("process.roles", _choice("controller", "broker"), None, "controller or broker"),
    Setting("cluster.id", str, None, "the cluster id every node must share (required)"),
    Setting("broker.session.timeout.ms", int, 9000, "a broker silent this long is fenced"),
    Setting("broker.heartbeat.interval.ms", int, 2000, "how often brokers heartbeat"),
    Setting("metrics.port", int, 0, "Prometheus metrics HTTP port (0 = off)"),
    Setting("metrics.host", str, "127.0.0.1", "metrics bind address"),
    Setting(
        "allow.insecure.listeners",
        parse_bool,
        False,
        "start even though a listener bound to a non-loopback address does not authenticate "
        "its clients (anyone on the network could then use it)",
    ),
    Setting(
        "max.connections.per.ip",
        parse_positive,
        1000,
        "connections from one client address beyond this are closed at once (so one host "
        "cannot take every connection slot)",
    ),
    Setting("log.level", _log_level, "INFO", "log level (any case); KRAFT_LOG_LEVEL overrides it"),
    Setting("log.file", str, "", "also log to this file, rotated by size (empty = stderr only)"),
    Setting(
        "log.file.max.bytes", parse_positive, 100 * 1024 * 1024, "rotate log.file at this size"
    ),
    Setting("log.file.backup.count", int, 10, "rotated log files kept"),
]

CONTROLLER_SETTINGS = COMMON_SETTINGS + [
    Setting(
        "controller.quorum.voters", str, None, "id@host:port of every controller's RPC endpoint"
    ),
    Setting(
        "controller.quorum.raft.voters",
        str,
        None,
        "id@host:port of every controller's Raft (PySyncObj) endpoint",
    ),
    Setting(
        "metadata.log.dir", str, None, "where the Raft journal, metadata log and snapshots live"
    ),
    Setting(
        "metadata.log.segment.bytes",
        int,
        16 * 1024 * 1024,
        "roll a metadata log segment at this size",
    ),
    Setting(
        "metadata.log.fsync",
        _choice("always", "never"),
        "always",
        "always: a command is in the Raft journal on disk on a majority before it is "
        "acknowledged; never: faster, loses acknowledged writes on power loss",
    ),
    Setting(
        "metadata.log.flush.interval.ms",
        parse_positive,
        100,
        "how often the metadata log (derived from the Raft journal, re-derived from it after "
        "a power loss) is synced; also synced before every snapshot",
    ),
    Setting(
        "metadata.log.max.record.bytes.between.snapshots",
        int,
        20 * 1024 * 1024,
        "write a snapshot after this much new log",
    ),
    Setting(
        "metadata.max.retention.ms",
        int,
        -1,
        "delete metadata log segments older than this once a snapshot covers them "
        "(-1: keep the whole history, the default)",
    ),
    Setting(
        "metadata.max.retention.bytes",
        int,
        -1,
        "delete the oldest metadata log segments covered by a snapshot while the log is "
        "larger than this (-1: no limit, the default)",
    ),
    Setting(
        "metadata.log.max.snapshot.interval.ms",
        int,
        3_600_000,
        "write a snapshot at least this often when there are new records (0 = never by time)",
    ),
    Setting(
        "metadata.max.idle.interval.ms",
        int,
        0,
        "write a NoOp record after this long without writes (0 = never; Kafka uses 500)",
    ),
    Setting("num.partitions", int, 1, "partitions of a topic created without a count"),
    Setting(
        "default.replication.factor", int, 1, "replication factor of a topic created without one"
    ),
    Setting("controller.quorum.election.timeout.ms", int, 1000, "Raft election timeout (max)"),
    Setting(
        "controller.quorum.fetch.timeout.ms",
        int,
        2500,
        "a leader that hears from no majority this long steps down",
    ),
    Setting("controller.rpc.max.frame.bytes", int, 8 * 1024 * 1024, "largest RPC frame accepted"),
    Setting(
        "controller.rpc.max.connections",
        int,
        4096,
        "RPC connections beyond this are closed at once",
    ),
    Setting(
        "controller.rpc.io.timeout.ms",
        int,
        10_000,
        "an RPC frame must arrive, a response be "
        "taken, and (with auth) a connection authenticate within this",
    ),
    Setting("controller.rpc.idle.timeout.ms", int, 600_000, "close RPC connections idle this long"),
    Setting(
        "controller.rpc.max.buffered.bytes",
        int,
        256 * 1024 * 1024,
        "incomplete RPC frames of all "
        "connections together may hold this much memory; the connection going over is closed",
    ),
    Setting(
        "controller.rpc.auth.credentials.file",
        str,
        "",
        "users allowed to call the controller "
        "RPC (name:pbkdf2_sha256$... lines); empty = no authentication",
    ),
    Setting(
        CLIENT_CREDENTIALS_KEY,
        str,
        "",
        "this node's own RPC credentials (username=/password= "
        "lines); required on controllers when controller.rpc.auth.credentials.file is set",
    ),
    Setting(
        "controller.rpc.broker.principals",
        str,
        "User:broker",
        "with RPC authentication, the principals allowed to call the broker APIs "
        "(BrokerRegistration, BrokerHeartbeat, AlterPartition, ...) and to act on behalf of "
        "their Kafka clients (comma-separated)",
    ),
    Setting(
        "controller.raft.secret.file",
        str,
        "",
        "file holding the Raft cluster secret, the same on every controller (or env "
        "KRAFT_RAFT_SECRET); required: Raft traffic is always encrypted",
    ),
    Setting(
        "raft.compaction.min.entries",
        int,
        100_000,
        "compact PySyncObj's journal after this many entries",
    ),
    Setting(
        "metadata.fetch.snapshot.min.lag.records",
        int,
        100_000,
        "a broker fetching this many records or more before the newest snapshot's end is told to "
        "load that snapshot instead of replaying the log (-1: only when the log no longer holds "
        "its offset)",
    ),
    Setting(
        "metadata.fetch.linger.ms",
        int,
        20,
        "after an entry is applied, brokers' waiting FetchMetadata long-polls are answered this "
        "much later, so one answer carries every entry applied meanwhile (0 = at once); the most "
        "the spacing grows to (see metadata.fetch.linger.per.broker.ms)",
    ),
    Setting(
        "metadata.fetch.linger.per.broker.ms",
        float,
        3.0,
        "while entries keep coming, wake-ups of the brokers' long-polls are spaced this much per "
        "broker the last one answered, up to metadata.fetch.linger.ms (a few brokers learn of a "
        "commit within milliseconds; many cost the leader's thread at most once per linger)",
    ),
    Setting(
        "controller.group.commit.fill.ms",
        int,
        2,
        "when a group of commands commits, the next group waits up to this long for the "
        "writers just answered to send again, so it carries them too (fewer Raft entries and "
        "journal syncs under concurrent load; a sequential writer never waits; 0 = send at once)",
    ),
]


def resolve_settings(props: dict[str, str], settings: list[Setting], what: str) -> dict[str, Any]:
    """Every setting's typed value from ``props`` or its default; an unknown key, a value that
    does not parse or a missing required one is a ConfigError naming it (``what``: the role)."""
    known = {s.key: s for s in settings}
    unknown = sorted(set(props) - set(known))
    if unknown:
        raise ConfigError(f"unknown {what} setting(s): {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for s in settings:
        if s.key in props:
            try:
                values[s.key] = s.parse(props[s.key])
            except ValueError as e:
                raise ConfigError(f"{s.key}={props[s.key]!r}: {e}") from None
        elif s.default is None:
            raise ConfigError(f"missing required {what} setting {s.key} ({s.doc})")
        else:
            values[s.key] = s.default
    return values


@dataclass(frozen=True)
class ControllerConfig:
    """A controller node's settings, validated."""

    values: dict[str, Any]
    node_id: int
    cluster_id: str
    rpc_voters: dict[int, tuple[str, int]]
    raft_voters: dict[int, tuple[str, int]]
    metadata_dir: Path
    raft_secret: str | None = field(default=None, repr=False)
    rpc_credentials: CredentialStore | None = field(default=None, repr=False)
    rpc_client_credentials: ClientCredentials | None = field(default=None, repr=False)

    @classmethod
    def from_properties(
        cls, props: dict[str, str], env: dict[str, str] | None = None
    ) -> ControllerConfig:
        v = resolve_settings(props, CONTROLLER_SETTINGS, "controller")
        if v["process.roles"] != "controller":
            raise ConfigError("process.roles must be 'controller' for a controller node")
        rpc = parse_voters(v["controller.quorum.voters"], "controller.quorum.voters")
        raft = parse_voters(v["controller.quorum.raft.voters"], "controller.quorum.raft.voters")
        if set(rpc) != set(raft):
            raise ConfigError(
                "controller.quorum.voters and controller.quorum.raft.voters name different ids"
            )
        if not 0 <= v["metadata.fetch.linger.ms"] <= 1000:
            raise ConfigError("metadata.fetch.linger.ms must be between 0 and 1000")
        if not 0 <= v["metadata.fetch.linger.per.broker.ms"] <= 1000:
            raise ConfigError("metadata.fetch.linger.per.broker.ms must be between 0 and 1000")
        if not 0 <= v["controller.group.commit.fill.ms"] <= 100:
            raise ConfigError("controller.group.commit.fill.ms must be between 0 and 100")
        if v["node.id"] not in rpc:
            raise ConfigError(
                f"node.id {v['node.id']} is not among controller.quorum.voters {sorted(rpc)}"
            )
        secret = _read_secret(
            v["controller.raft.secret.file"], env if env is not None else os.environ
        )
        if secret is None:
            raise ConfigError(MISSING_RAFT_SECRET)
        store = None
        if v["controller.rpc.auth.credentials.file"]:
            try:
                store = CredentialStore.load(v["controller.rpc.auth.credentials.file"])
            except AuthError as e:
                raise ConfigError(f"controller.rpc.auth.credentials.file: {e}") from None
            if not v[CLIENT_CREDENTIALS_KEY]:
                raise ConfigError(
                    f"{CLIENT_CREDENTIALS_KEY} is required when controller.rpc.auth.credentials.file "
                    "is set: controllers call each other's RPC"
                )
        rpc_host = rpc[v["node.id"]][0]
        if store is None and not is_loopback(rpc_host) and not v["allow.insecure.listeners"]:
            raise ConfigError(
                f"controller.quorum.voters: this controller's RPC binds to {rpc_host}, not a "
                "loopback address, without authentication (anyone reaching it could fence "
                "brokers or delete topics): set controller.rpc.auth.credentials.file, or "
                "allow.insecure.listeners=true to accept that"
            )
        return cls(
            v,
            v["node.id"],
            v["cluster.id"],
            rpc,
            raft,
            Path(v["metadata.log.dir"]),
            secret,
            store,
            client_credentials(v[CLIENT_CREDENTIALS_KEY]),
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ControllerConfig:
        return cls.from_properties(load_properties(path))

    def __getitem__(self, key: str) -> Any:
        return self.values[key]


MISSING_RAFT_SECRET = (
    "controller.raft.secret.file is not set (nor KRAFT_RAFT_SECRET): Raft traffic is always "
    "encrypted, loopback included, because PySyncObj peers exchange pickles that anyone "
    "reaching the port could use to run code. A cluster directory made by an older "
    "'kraft cluster up' gets one on 'kraft cluster start'; otherwise write 32 random bytes, "
    "e.g. 'umask 077; head -c 32 /dev/urandom | base64 > raft.secret', copy that file to "
    "every controller and set controller.raft.secret.file=<its path> on each"
)
MIN_RAFT_SECRET_BYTES = 32


def _read_secret(path: str, env: Mapping[str, str]) -> str | None:
    """The Raft secret from ``path`` (or KRAFT_RAFT_SECRET): at least MIN_RAFT_SECRET_BYTES,
    and a file readable by its owner only, else a ConfigError saying how to fix it."""
    if path:
        try:
            mode = Path(path).stat().st_mode
            secret = Path(path).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise ConfigError(
                f"controller.raft.secret.file: cannot read {path}: {e.strerror}"
            ) from None
        except UnicodeDecodeError:
            raise ConfigError(
                f"controller.raft.secret.file: {path} is not text (write it base64-encoded: "
                "'umask 077; head -c 32 /dev/urandom | base64 > raft.secret')"
            ) from None
        if mode & 0o077:
            raise ConfigError(
                f"controller.raft.secret.file: {path} is readable by group or others "
                f"(mode {mode & 0o777:04o}); whoever reads it can run code on every controller: "
                f"chmod 600 {path}"
            )
        where = path
    else:
        secret = env.get("KRAFT_RAFT_SECRET") or ""
        if not secret:
            return None
        where = "KRAFT_RAFT_SECRET"
    size = len(secret.encode("utf-8"))
    if size < MIN_RAFT_SECRET_BYTES:
        raise ConfigError(
            f"controller.raft.secret.file: {where} holds {size} bytes; a Raft secret needs at "
            f"least {MIN_RAFT_SECRET_BYTES} ('umask 077; head -c 32 /dev/urandom | base64 > "
            "raft.secret', the same file on every controller)"
        )
    return secret


def client_credentials(path: str) -> ClientCredentials | None:
    """The RPC client credentials in ``path`` (empty: none), or a ConfigError."""
    if not path:
        return None
    try:
        return ClientCredentials.load(path)
    except AuthError as e:
        raise ConfigError(f"{CLIENT_CREDENTIALS_KEY}: {e}") from None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
