"""``kraft shell``: the interactive metadata shell over a log directory or a live controller."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from types import ModuleType

from tools import output
from tools.commands.common import ManualFormatter, UsageError, int_at_least
from tools.commands.log_cmd import add_source_options, load_history
from tools.log_reader import History, LogReadError
from tools.metadata_shell import MetadataShell

HISTORY_ENV = "KRAFT_SHELL_HISTORY"


def open_shell(history: History, at_offset: int | None) -> MetadataShell:
    """A shell over the image at ``at_offset`` (None: the latest)."""
    if at_offset is not None and at_offset > history.last_offset:
        raise UsageError(f"--at-offset {at_offset} is beyond the last offset {history.last_offset}")
    try:
        image = history.image_at(at_offset)
    except LogReadError as e:
        raise UsageError(str(e)) from None
    count = len(history.batches) if at_offset is None else history.batch_index_through(at_offset)
    names = {t.topic_id: t.name for t in history.base.topics_by_id.values()}
    return MetadataShell(image, history.batches[:count], history.source, names)


def _readline() -> ModuleType | None:
    """The readline module, or None on a platform without it (plain input then)."""
    try:
        import readline
    except ImportError:
        return None
    return readline


def _interactive(shell: MetadataShell) -> int:
    readline = _readline()
    hist = Path(os.environ.get(HISTORY_ENV) or Path.home() / ".kraft_shell_history")
    if readline is not None:
        try:
            readline.read_history_file(hist)
        except OSError:
            pass
    try:
        shell.cmdloop()
    except KeyboardInterrupt:
        print()
    finally:
        if readline is not None:
            try:
                readline.set_history_length(1000)
                readline.write_history_file(hist)
            except OSError:
                pass
    return output.EXIT_OK


def cmd_shell(args: argparse.Namespace) -> int:
    history = load_history(args)
    if history is None:
        return output.EXIT_ERROR
    shell = open_shell(history, args.at_offset)
    if args.command_text is not None:
        return output.EXIT_OK if shell.run_script(args.command_text) else output.EXIT_ERROR
    if not sys.stdin.isatty():  # commands piped in, one per line
        return (
            output.EXIT_OK
            if shell.run_script(";".join(sys.stdin.read().splitlines()))
            else output.EXIT_ERROR
        )
    return _interactive(shell)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kraft shell``."""
    p = sub.add_parser(
        "shell",
        help="browse the metadata image like a file system",
        formatter_class=ManualFormatter,
        description="An interactive shell over the metadata image at the latest offset (or "
        "--at-offset N): ls, cd, pwd, cat, find, tree, history, help, exit. The "
        "tree is /brokers/<id>/..., /topics/<name>/<partition>/..., "
        "/configs/{topics,brokers}/<name>/<key>, /features/<name> and /image "
        "(offset, term, checksum, active controller). 'history PATH' lists the "
        "records that touched a node with their offsets and who/why.\n\n"
        "Offline it reads PATH (a log directory, a controller's metadata dir, a "
        "segment from offset 0 or a snapshot; a running controller's directory is "
        "fine). Live (--cluster/--bootstrap-controller) it pulls the log from a "
        "controller with FetchMetadata.",
        epilog="examples:\n  kraft shell ./c/controller-1/metadata\n"
        "  kraft shell --cluster ./c -c 'ls /topics; cat /topics/orders/0'\n"
        "  kraft shell ./c/controller-1/metadata --at-offset 40 -c 'tree /brokers'\n"
        "  kraft shell --cluster ./c -c 'history /topics/orders/0'\n\n"
        "-c runs ';'-separated commands and exits (status 1 if one failed); commands "
        f"piped on stdin run the same way. Readline history: ~/.kraft_shell_history "
        f"(env {HISTORY_ENV}).",
    )
    add_source_options(p)
    p.add_argument(
        "--at-offset",
        type=int_at_least(-1),
        metavar="N",
        help="the image after the batch holding offset N (default: latest)",
    )
    p.add_argument(
        "-c", dest="command_text", metavar="COMMANDS", help="run ';'-separated commands and exit"
    )
    p.set_defaults(handler=cmd_shell)
