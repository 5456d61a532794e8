"""Controller RPC authentication: SASL/PLAIN-style shared credentials (pure, no I/O but files).

The controller holds a **credentials file** (``controller.rpc.auth.credentials.file``), one user
a line, ``name:pbkdf2_sha256$<iterations>$<salt b64>$<hash b64>`` (``#`` comments). Passwords
are never stored: each line keeps a salted PBKDF2-HMAC-SHA256 hash, and checking compares
digests in constant time (an unknown name costs the same as a wrong password).

A client (CLI, broker, another controller) holds a **client credentials file** of
``key=value`` lines ``username=NAME`` and ``password=SECRET``, or the environment variables
``KRAFT_RPC_USERNAME`` + ``KRAFT_RPC_PASSWORD`` (or ``KRAFT_RPC_CREDENTIALS_FILE``); never a
command-line argument. The authenticated principal is ``User:<name>``.

``python -m kraft.rpc.auth add-user [--iterations N] FILE NAME`` reads a password from stdin (or
``KRAFT_RPC_PASSWORD``) and appends its hashed line to FILE (``--iterations 1000`` suits random
256-bit passwords, which need no key stretching; every login pays the iterations).
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import hmac
import os
import re
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

__all__ = [
    "AUTH_API",
    "MECHANISM",
    "AuthError",
    "ClientCredentials",
    "CredentialStore",
    "hash_password",
    "principal_of",
    "write_cluster_credentials",
]

AUTH_API = "SaslAuthenticate"
MECHANISM = "PLAIN"
DEFAULT_ITERATIONS = 100_000  # for passwords people choose
GENERATED_ITERATIONS = 1_000  # for random 256-bit passwords (write_cluster_credentials)
_SCHEME = "pbkdf2_sha256"
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
MAX_PASSWORD_BYTES = 1024
ENV_USERNAME = "KRAFT_RPC_USERNAME"
ENV_PASSWORD = "KRAFT_RPC_PASSWORD"
ENV_FILE = "KRAFT_RPC_CREDENTIALS_FILE"


class AuthError(ValueError):
    """Unusable credentials or credentials file; the message never contains a password."""


def principal_of(username: str) -> str:
    """The principal records carry for an authenticated ``username``."""
    return f"User:{username}"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def hash_password(
    password: str, *, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None
) -> str:
    """``pbkdf2_sha256$iterations$salt$hash`` for ``password`` (fresh 16-byte salt by default)."""
    if not password:
        raise AuthError("a password must not be empty")
    salt = secrets.token_bytes(16) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    return f"{_SCHEME}${iterations}${_b64(salt)}${_b64(digest)}"


@dataclass(frozen=True)
class _Hash:
    iterations: int
    salt: bytes
    digest: bytes

    @classmethod
    def parse(cls, text: str, where: str) -> _Hash:
        parts = text.split("$")
        try:
            if len(parts) != 4 or parts[0] != _SCHEME:
                raise ValueError
            iterations = int(parts[1])
            salt, digest = (
                base64.b64decode(parts[2], validate=True),
                base64.b64decode(parts[3], validate=True),
            )
        except ValueError:
            raise AuthError(f"{where}: expected {_SCHEME}$ITERATIONS$SALT$HASH") from None
        if not 1_000 <= iterations <= 10_000_000 or len(salt) < 8 or len(digest) != 32:
            raise AuthError(
                f"{where}: iterations must be 1000..10000000, salt >= 8 bytes, hash 32 bytes"
            )
        return cls(iterations, salt, digest)

    def matches(self, password: bytes) -> bool:
        return hmac.compare_digest(
            hashlib.pbkdf2_hmac("sha256", password, self.salt, self.iterations), self.digest
        )


@dataclass
class CredentialStore:
    """The controller's users: ``verify(name, password) -> principal | None``."""

    users: dict[str, _Hash]
    source: str = ""
    _dummy: _Hash = field(
        default_factory=lambda: _Hash(
            DEFAULT_ITERATIONS, secrets.token_bytes(16), secrets.token_bytes(32)
        )
    )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CredentialStore:
        """Read a credentials file; ``AuthError`` names the file and line of a bad entry."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise AuthError(
                f"cannot read credentials file {path}: {getattr(e, 'strerror', None) or e}"
            ) from None
        users: dict[str, _Hash] = {}
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            where = f"{path}:{lineno}"
            name, sep, hashed = line.partition(":")
            if not sep or not _NAME.match(name):
                raise AuthError(
                    f"{where}: expected NAME:{_SCHEME}$..., NAME of letters, digits, '._-'"
                )
            if name in users:
                raise AuthError(f"{where}: user {name!r} is listed twice")
            users[name] = _Hash.parse(hashed, where)
        if not users:
            raise AuthError(f"credentials file {path} lists no users")
        slowest = max(h.iterations for h in users.values())
        return cls(
            users, str(path), _Hash(slowest, secrets.token_bytes(16), secrets.token_bytes(32))
        )

    def verify(self, username: object, password: object) -> str | None:
        """The principal of a correct name and password, else None (same cost either way)."""
        name_ok = isinstance(username, str) and username in self.users
        entry = self.users[cast(str, username)] if name_ok else self._dummy  # name_ok: a str
        if isinstance(password, str):
            secret = password.encode("utf-8", "surrogatepass")
        elif isinstance(password, bytes):
            secret = password
        else:
            secret = b""
        ok = entry.matches(secret[:MAX_PASSWORD_BYTES]) and len(secret) <= MAX_PASSWORD_BYTES
        return principal_of(cast(str, username)) if ok and name_ok else None


@dataclass(frozen=True)
class ClientCredentials:
    """A client's name and password (``repr`` hides the password)."""

    username: str
    password: str = field(repr=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.username):
            raise AuthError(f"bad username {self.username!r}: letters, digits, '._-' only")
        if not self.password:
            raise AuthError(f"empty password for {self.username!r}")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ClientCredentials:
        """Read ``username=`` / ``password=`` lines from ``path``."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise AuthError(
                f"cannot read client credentials file {path}: {getattr(e, 'strerror', None) or e}"
            ) from None
        values: dict[str, str] = {}
        for raw in text.splitlines():
            line = raw.strip()
            if line and not line.startswith("#"):
                key, sep, value = line.partition("=")
                if sep:
                    values[key.strip()] = value.strip()
        if "username" not in values or "password" not in values:
            raise AuthError(f"client credentials file {path} needs username= and password= lines")
        return cls(values["username"], values["password"])

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientCredentials | None:
        """From ``KRAFT_RPC_CREDENTIALS_FILE`` or ``KRAFT_RPC_USERNAME``/``_PASSWORD``; None if unset."""
        env = os.environ if env is None else env
        if env.get(ENV_FILE):
            return cls.load(env[ENV_FILE])
        if env.get(ENV_USERNAME) or env.get(ENV_PASSWORD):
            return cls(env.get(ENV_USERNAME, ""), env.get(ENV_PASSWORD, ""))
        return None

    def handshake_body(self) -> dict[str, str]:
        """The ``SaslAuthenticate`` request body."""
        return {"mechanism": MECHANISM, "username": self.username, "password": self.password}


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def write_cluster_credentials(
    directory: Path,
    users: tuple[str, ...] = ("admin", "broker", "controller"),
    iterations: int = GENERATED_ITERATIONS,
) -> dict[str, Path]:
    """Create random passwords for ``users``: ``directory/rpc-users`` (hashes, for controllers)
    and ``directory/<user>.credentials`` (client files, mode 0600). Returns user → client file.

    The passwords are 256 random bits, which no amount of guessing recovers from a hash, so they
    are hashed with few iterations: a controller failover then costs each reconnecting client
    milliseconds, not the ~0.1-0.3 s a stretched human password costs."""
    directory.mkdir(parents=True, exist_ok=True)
    lines, files = [], {}
    for user in users:
        password = secrets.token_urlsafe(32)
        lines.append(f"{user}:{hash_password(password, iterations=iterations)}")
        files[user] = directory / f"{user}.credentials"
        _write_private(files[user], f"username={user}\npassword={password}\n")
    _write_private(directory / "rpc-users", "\n".join(lines) + "\n")
    return files


def _main(argv: list[str]) -> int:
    iterations = DEFAULT_ITERATIONS
    if len(argv) == 5 and argv[1] == "--iterations" and argv[2].isdigit() and int(argv[2]) > 0:
        iterations, argv = int(argv[2]), [argv[0], *argv[3:]]  # fewer for random passwords
    if len(argv) != 3 or argv[0] != "add-user":
        print(
            "usage: python -m kraft.rpc.auth add-user [--iterations N] FILE NAME  (password on "
            f"stdin or {ENV_PASSWORD}; default {DEFAULT_ITERATIONS} PBKDF2 iterations)",
            file=sys.stderr,
        )
        return 2
    path, name = argv[1], argv[2]
    if os.environ.get(ENV_PASSWORD):
        password = os.environ[ENV_PASSWORD]
    elif sys.stdin.isatty():
        password = getpass.getpass(f"password for {name}: ")
    else:
        password = sys.stdin.readline().rstrip("\n")
    try:
        if not _NAME.match(name):
            raise AuthError(f"bad user name {name!r}: letters, digits, '._-' only")
        if Path(path).exists() and any(
            line.startswith(f"{name}:")
            for line in Path(path).read_text(encoding="utf-8").splitlines()
        ):
            raise AuthError(f"{name} is already listed in {path}")
        line = f"{name}:{hash_password(password, iterations=iterations)}\n"
    except AuthError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    if not Path(path).exists():
        _write_private(Path(path), "")
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
    print(f"added {name} to {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_main(sys.argv[1:]))
