"""What every client command shares: connection options, the controller call, item errors.

A command handler takes the parsed ``argparse.Namespace`` and returns an exit code. It raises
:class:`UsageError` for bad arguments (exit 2) and lets :class:`~kraft.errors.KraftError`
propagate for a failed request (exit 1); ``tools.cli.main`` turns both into output.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kraft.errors import ErrorCode, KraftError
from tools import output

# One controller's time to answer before the command asks another (a stalled one never does).
ATTEMPT_TIMEOUT_S = 2.0
DEFAULT_TIMEOUT_S = 10.0
BOOTSTRAP_ENV = "KRAFT_BOOTSTRAP_CONTROLLER"
CLUSTER_DIR_ENV = "KRAFT_CLUSTER_DIR"


class UsageError(Exception):
    """Bad command-line input detected after parsing (exit code 2)."""


Handler = Callable[[argparse.Namespace], int]


class ManualFormatter(argparse.HelpFormatter):
    """Help that reads like a manual page: prose paragraphs (separated by blank lines) are
    re-wrapped to the terminal width; paragraphs with indented lines (examples) stay as written.
    """

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=34)

    def add_argument(self, action: argparse.Action) -> None:
        """argparse measures sub-command names at their parent's indent but prints them deeper,
        so a long name pushed its help to the next line; measure them where they are printed."""
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction) and action.help is not argparse.SUPPRESS:
            names = [len(self._format_action_invocation(a)) for a in action._get_subactions()]
            if names:
                deeper = max(names) + self._current_indent + self._indent_increment
                self._action_max_length = max(self._action_max_length, deeper)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for para in text.split("\n\n"):
            lines = para.splitlines()
            if any(line.startswith(" ") for line in lines) or para.rstrip().endswith(":"):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(
                    textwrap.fill(
                        " ".join(line.strip() for line in lines),
                        width,
                        initial_indent=indent,
                        subsequent_indent=indent,
                    )
                )
        return "\n\n".join(paragraphs)


def add_client_options(parser: argparse.ArgumentParser) -> None:
    """The options every command that talks to the controllers accepts."""
    g = parser.add_argument_group("connection and output")
    where = g.add_mutually_exclusive_group()
    where.add_argument(
        "--bootstrap-controller",
        metavar="HOST:PORT[,HOST:PORT]",
        help="controller RPC endpoint(s); any controller will do, requests "
        f"follow the active one (env {BOOTSTRAP_ENV})",
    )
    where.add_argument(
        "--cluster",
        metavar="DIR",
        help="a local cluster directory made by 'kraft cluster up'; its "
        f"cluster.json lists the controllers (env {CLUSTER_DIR_ENV})",
    )
    g.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"give up after S seconds (default {DEFAULT_TIMEOUT_S:g}); a controller silent "
        f"for {ATTEMPT_TIMEOUT_S:g}s is skipped for the next",
    )
    g.add_argument(
        "--json",
        action="store_true",
        help="print the response as JSON (errors as {error, error_code, message})",
    )


def positive_float(text: str) -> float:
    """argparse type: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def int_at_least(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}: {text!r}")
        return value

    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def parse_endpoint(text: str) -> tuple[str, int]:
    """``host:port`` (or ``[v6addr]:port``) → ``(host, port)``; raises UsageError."""
    text = text.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise UsageError(f"bad endpoint {text!r}: expected HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(f"bad endpoint {text!r}: port {port_text!r} is not a number") from None
    if not 0 < port < 65536:
        raise UsageError(f"bad endpoint {text!r}: port out of range")
    return host, port


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """``host:port,host:port`` → list of endpoints (at least one)."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise UsageError("no controller endpoint given")
    return [parse_endpoint(p) for p in parts]


def resolve_bootstrap(args: argparse.Namespace) -> list[tuple[str, int]]:
    """The controller RPC endpoints to use: --bootstrap-controller, --cluster, then the env."""
    if getattr(args, "bootstrap_controller", None):
        return parse_endpoints(args.bootstrap_controller)
    cluster_dir = getattr(args, "cluster", None) or os.environ.get(CLUSTER_DIR_ENV)
    if not cluster_dir and os.environ.get(BOOTSTRAP_ENV):
        return parse_endpoints(os.environ[BOOTSTRAP_ENV])
    if cluster_dir:
        from tools.cluster import read_cluster_json

        try:
            layout = read_cluster_json(Path(cluster_dir))
        except FileNotFoundError:
            raise UsageError(
                f"{cluster_dir} holds no cluster.json; is it a directory made by "
                "'kraft cluster up'?"
            ) from None
        endpoints = layout.controller_endpoints()
        if not endpoints:
            raise UsageError(f"{cluster_dir}/cluster.json lists no controllers")
        return endpoints
    raise UsageError(
        "no controller to talk to: pass --bootstrap-controller HOST:PORT or --cluster DIR"
    )


def resolve_credentials(args: argparse.Namespace) -> Any:
    """RPC credentials: env ``KRAFT_RPC_CREDENTIALS_FILE`` or ``KRAFT_RPC_USERNAME``/``_PASSWORD``,
    else those of a ``--cluster DIR`` started with ``--auth``, else None (never a CLI flag)."""
    from kraft.rpc.auth import AuthError, ClientCredentials

    try:
        creds = ClientCredentials.from_env()
        cluster_dir = getattr(args, "cluster", None) or os.environ.get(CLUSTER_DIR_ENV)
        if creds is None and cluster_dir and not getattr(args, "bootstrap_controller", None):
            from tools.cluster import admin_credentials, read_cluster_json

            try:
                creds = admin_credentials(read_cluster_json(Path(cluster_dir)))
            except FileNotFoundError:
                return None
    except AuthError as e:
        raise UsageError(str(e)) from None
    return creds


def call(args: argparse.Namespace, api: str, body: dict[str, Any]) -> dict[str, Any]:
    """Send one request to the controllers named by ``args``; raise KraftError on failure."""
    return call_endpoints(
        resolve_bootstrap(args), api, body, args.timeout, resolve_credentials(args)
    )


def call_endpoints(
    bootstrap: list[tuple[str, int]],
    api: str,
    body: dict[str, Any],
    timeout: float,
    credentials: Any = None,
) -> dict[str, Any]:
    """``kraft.rpc.client.call_sync`` with transport failures turned into KraftError."""
    from kraft.rpc.client import call_sync

    try:
        return call_sync(
            bootstrap,
            api,
            body,
            timeout,
            credentials=credentials,
            attempt_timeout=min(timeout, ATTEMPT_TIMEOUT_S),
        )
    except KraftError as e:
        if e.code == ErrorCode.SASL_AUTHENTICATION_FAILED and credentials is None:
            raise KraftError(
                e.code,
                f"{e.message} (these controllers require credentials: set "
                "KRAFT_RPC_CREDENTIALS_FILE, or use --cluster DIR for a cluster "
                "started with --auth)",
            ) from None
        raise
    except TimeoutError as e:
        raise KraftError(
            ErrorCode.REQUEST_TIMED_OUT, f"no answer from {_show(bootstrap)} within {timeout:g}s"
        ) from e
    except OSError as e:
        raise KraftError(
            ErrorCode.NETWORK_EXCEPTION, f"cannot reach {_show(bootstrap)}: {e.strerror or e}"
        ) from e


def _show(bootstrap: Iterable[tuple[str, int]]) -> str:
    return ",".join(f"{h}:{p}" for h, p in bootstrap)


def parse_key_values(items: Iterable[str] | None, option: str) -> dict[str, str]:
    """Repeated ``k=v`` options → dict (the value may contain ``=`` and ``,``)."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"{option} expects KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def item_failed(item: dict[str, Any]) -> bool:
    """True when a per-item result carries a non-zero error code."""
    return bool(item.get("error_code"))


def print_item_error(label: str, item: dict[str, Any]) -> None:
    """``Error: NAME: <label>: message`` for one failed item of a batch response."""
    msg = item.get("error_message") or ""
    text = f"{label}: {msg}" if msg else label
    print(output.error_line(item["error_code"], text), file=sys.stderr)


def print_json(value: Any) -> None:
    """Write ``value`` as JSON on stdout."""
    print(output.to_json(value))


def show(
    args: argparse.Namespace,
    resp: dict[str, Any],
    render: Callable[[dict[str, Any]], str],
    json_value: Any = None,
) -> int:
    """Print a read response: JSON (``json_value`` or the response) with --json, else ``render``."""
    if args.json:
        print_json(resp if json_value is None else json_value)
    else:
        print(render(resp))
    return output.EXIT_OK


def report_items(
    args: argparse.Namespace,
    resp: dict[str, Any],
    key: str,
    label: Callable[[dict[str, Any]], str],
    ok_line: Callable[[dict[str, Any]], str],
    tolerated: tuple[int, Callable[[dict[str, Any]], str]] | None = None,
) -> int:
    """Report the per-item results ``resp[key]`` of a batch response and return the exit code.

    With --json: the response with an ``error`` name next to each item's code. Otherwise one
    line per item: ``ok_line(item)`` on success, an ``Error:`` line on stderr on failure. An
    error the user asked to tolerate (e.g. ``--if-exists``) is ``tolerated = (code, line)``:
    printed with ``line(item)`` and not counted as a failure."""
    items = resp.get(key, [])
    failed = False
    for item in items:
        code = item.get("error_code") or 0
        if tolerated is not None and code == tolerated[0]:
            line = tolerated[1](item)
        elif code:
            failed = True
            if not args.json:
                print_item_error(label(item), item)
            continue
        else:
            line = ok_line(item)
        if not args.json:
            print(line)
    if args.json:
        print_json({**resp, key: output.annotate_errors(items)})
    return output.EXIT_ERROR if failed else output.EXIT_OK
