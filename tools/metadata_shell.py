"""The metadata shell: a virtual file tree over a :class:`~kraft.metadata.image.MetadataImage` and the
history of records that built it (``kraft shell``).

Tree::

    /brokers/<id>/{broker_id, incarnation_id, epoch, state, fenced, in_controlled_shutdown,
                   rack, endpoints, features}
    /topics/<name>/{topic_id, <partition>/{leader, leader_epoch, partition_epoch, replicas,
                    isr, removing_replicas, adding_replicas, leader_recovery_state}}
    /configs/topics/<name>/<key>, /configs/brokers/<id>/<key>, /configs/brokers/default/<key>
    /features/<name>
    /image/{offset, term, raft_index, timestamp_ms, time, checksum, last_hash, controller_id,
            next_producer_id}

Commands: ls, cd, pwd, cat, find, tree, history, help, exit. ``cat`` of a directory prints its
files as ``key: value`` lines. ``history PATH`` lists the records that touched the node at PATH
(or anything under or above it) with offsets and provenance.
"""

from __future__ import annotations

import cmd
import fnmatch
import posixpath
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from kraft.metadata.image import MetadataImage, TopicImage
from kraft.metadata.registrations import BrokerRegistration, PartitionRegistration
from kraft.records import (
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
    Batch,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    FeatureLevelRecord,
    PartitionChangeRecord,
    PartitionRecord,
    Record,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnregisterBrokerRecord,
)
from tools import output
from tools.log_format import record_item, render_item
from tools.log_history import iso_time


class ShellError(Exception):
    """A command that cannot run: no such node, not a directory, bad arguments."""


# ------------------------------------------------------------------------------ the tree


@dataclass(slots=True)
class Node:
    """A directory (``list_children`` set) or a file (``value``)."""

    value: Any = None
    list_children: Callable[[], dict[str, Node]] | None = None
    _children: dict[str, Node] | None = field(default=None, repr=False)

    @property
    def is_dir(self) -> bool:
        return self.list_children is not None

    def children(self) -> dict[str, Node]:
        if self.list_children is None:
            raise ShellError("not a directory")
        if self._children is None:
            self._children = self.list_children()
        return self._children


def _dir(fn: Callable[[], dict[str, Node]]) -> Node:
    return Node(list_children=fn)


def _files(values: dict[str, Any]) -> Node:
    return _dir(lambda: {k: Node(v) for k, v in values.items()})


def _broker_node(b: BrokerRegistration) -> Node:
    state = (
        "controlled-shutdown" if b.in_controlled_shutdown else "fenced" if b.fenced else "unfenced"
    )
    return _files(
        {
            "broker_id": b.broker_id,
            "incarnation_id": b.incarnation_id,
            "epoch": b.epoch,
            "state": state,
            "fenced": b.fenced,
            "in_controlled_shutdown": b.in_controlled_shutdown,
            "rack": b.rack,
            "endpoints": [f"{e['name']}://{e['host']}:{e['port']}" for e in b.endpoints],
            "features": [f"{f['name']}:{f['min_version']}-{f['max_version']}" for f in b.features],
        }
    )


def _partition_node(p: PartitionRegistration) -> Node:
    return _files(
        {
            "leader": p.leader,
            "leader_epoch": p.leader_epoch,
            "partition_epoch": p.partition_epoch,
            "replicas": list(p.replicas),
            "isr": list(p.isr),
            "removing_replicas": list(p.removing_replicas),
            "adding_replicas": list(p.adding_replicas),
            "leader_recovery_state": p.leader_recovery_state,
        }
    )


def _topic_node(t: TopicImage) -> Node:
    def children() -> dict[str, Node]:
        out = {"topic_id": Node(t.topic_id)}
        for pid in sorted(t.partitions):
            out[str(pid)] = _partition_node(t.partitions[pid])
        return out

    return _dir(children)


def _configs_node(image: MetadataImage) -> Node:
    def of_type(resource_type: int, default_name: str) -> Callable[[], dict[str, Node]]:
        def children() -> dict[str, Node]:
            out = {}
            for (rtype, name), entries in sorted(image.configs.items()):
                if rtype == resource_type:
                    out[name or default_name] = _files(dict(sorted(entries.items())))
            return out

        return children

    return _dir(
        lambda: {
            "topics": _dir(of_type(RESOURCE_TOPIC, "")),
            "brokers": _dir(of_type(RESOURCE_BROKER, "default")),
        }
    )


def image_root(image: MetadataImage) -> Node:
    """The root directory of the virtual tree over ``image``."""
    return _dir(
        lambda: {
            "brokers": _dir(
                lambda: {str(b): _broker_node(image.brokers[b]) for b in sorted(image.brokers)}
            ),
            "topics": _dir(
                lambda: {
                    name: _topic_node(image.topics_by_id[image.topics_by_name[name]])
                    for name in sorted(image.topics_by_name)
                }
            ),
            "configs": _configs_node(image),
            "features": _files(dict(sorted(image.features.items()))),
            "image": _files(
                {
                    "offset": image.offset,
                    "term": image.term,
                    "raft_index": image.raft_index,
                    "timestamp_ms": image.timestamp_ms,
                    "time": iso_time(image.timestamp_ms) if image.timestamp_ms else None,
                    "checksum": image.checksum(),
                    "last_hash": image.last_hash.hex(),
                    "controller_id": image.controller_id,
                    "next_producer_id": image.next_producer_id,
                }
            ),
        }
    )


# ------------------------------------------------------------------------------ history


def touched_paths(
    batches: list[Batch], names: dict[str, str] | None = None
) -> Iterator[tuple[Batch, int, Record, str]]:
    """``(batch, index, record, path)`` for every record: the tree path it changed (``/image``
    for records that only move the image, e.g. a controller failover). ``names`` maps the ids of
    topics created before ``batches`` to their names."""
    names = dict(names or {})
    for batch in batches:
        for i, r in enumerate(batch.records):
            if isinstance(r, TopicRecord):
                names[r.topic_id] = r.name
            yield batch, i, r, _path_of(r, names)


def _path_of(r: Record, names: dict[str, str]) -> str:
    if isinstance(
        r, (RegisterBrokerRecord, UnregisterBrokerRecord, BrokerRegistrationChangeRecord)
    ):
        return f"/brokers/{r.broker_id}"
    if isinstance(r, TopicRecord):
        return f"/topics/{r.name}"
    if isinstance(r, (PartitionRecord, PartitionChangeRecord)):
        return f"/topics/{names.get(r.topic_id, r.topic_id)}/{r.partition_id}"
    if isinstance(r, RemoveTopicRecord):
        return f"/topics/{names.get(r.topic_id, r.topic_id)}"
    if isinstance(r, ConfigRecord):
        kind = "topics" if r.resource_type == RESOURCE_TOPIC else "brokers"
        name = r.resource_name or ("default" if r.resource_type == RESOURCE_BROKER else "")
        return f"/configs/{kind}/{name}/{r.name}"
    if isinstance(r, FeatureLevelRecord):
        return f"/features/{r.name}"
    return "/image"  # LeaderChange, ProducerIds, NoOp: only the image's position moves


def related(path: str, touched: str) -> bool:
    """True when a record that changed ``touched`` belongs in the history of ``path``: the same
    node, a node under it, or a node above it."""
    if path == "/":
        return True
    return touched == path or touched.startswith(path + "/") or path.startswith(touched + "/")


# ------------------------------------------------------------------------------ the shell


class MetadataShell(cmd.Cmd):
    """The command loop. ``run_line`` runs one command and returns False if it failed."""

    intro = "pykraft metadata shell: type 'help' for commands, 'exit' to leave."

    def __init__(
        self,
        image: MetadataImage,
        batches: list[Batch],
        source: str,
        known_names: dict[str, str] | None = None,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
    ) -> None:
        """``batches``: the history shown by ``history`` (the records after ``known_names``'
        image, up to ``image``); ``known_names``: topic id → name for topics older than it."""
        super().__init__(stdout=stdout)
        self.image = image
        self.batches = batches
        self.known_names = known_names or {}
        self.stderr = stderr or sys.stderr
        self.source = source
        self.root = image_root(image)
        self.cwd = "/"
        self.failed = False
        self.prompt = "kraft:/> "

    # ---- paths ------------------------------------------------------------------------------

    def absolute(self, path: str | None) -> str:
        """``path`` resolved against the working directory and normalised."""
        if not path:
            return self.cwd
        joined = posixpath.normpath(posixpath.join(self.cwd, path))
        return "/" + joined.lstrip("/") if joined != "/" else "/"

    def lookup(self, path: str) -> Node:
        node = self.root
        for part in [p for p in path.split("/") if p]:
            if not node.is_dir:
                raise ShellError(f"{path}: not a directory")
            children = node.children()
            if part not in children:
                raise ShellError(f"{path}: no such node")
            node = children[part]
        return node

    def say(self, text: str = "") -> None:
        self.stdout.write(text + "\n")

    # ---- running ----------------------------------------------------------------------------

    def run_line(self, line: str) -> bool:
        """Run one command line; errors are printed. Returns False when the command failed."""
        self.failed = False
        self.onecmd(line)
        return not self.failed

    def run_script(self, script: str) -> bool:
        """Run ``;``-separated commands (``-c``). Stops at ``exit``; False if any failed."""
        ok = True
        for line in split_commands(script):
            if line.split()[0] in ("exit", "quit"):
                break
            ok = self.run_line(line) and ok
        return ok

    def onecmd(self, line: str) -> bool:
        try:
            return super().onecmd(line)
        except ShellError as e:
            self.failed = True
            self.stderr.write(f"error: {e}\n")
            return False

    def preloop(self) -> None:
        try:
            import readline
        except ImportError:
            return
        readline.set_completer_delims(" \t\n;")  # complete whole paths, '/' included

    def emptyline(self) -> bool:
        return False

    def default(self, line: str) -> None:
        raise ShellError(f"unknown command {line.split()[0]!r} (try 'help')")

    def postcmd(self, stop: bool, line: str) -> bool:
        self.prompt = f"kraft:{self.cwd}> "
        return stop

    def _args(self, arg: str) -> list[str]:
        try:
            return shlex.split(arg)
        except ValueError as e:
            raise ShellError(str(e)) from None

    # ---- commands ---------------------------------------------------------------------------

    def do_ls(self, arg: str) -> None:
        """ls [PATH...]: list a directory (directories end in /), or name a file."""
        paths: list[str | None] = [*self._args(arg)] or [None]
        for i, p in enumerate(paths):
            path = self.absolute(p)
            node = self.lookup(path)
            if len(paths) > 1:
                self.say(("\n" if i else "") + f"{path}:")
            if not node.is_dir:
                self.say(posixpath.basename(path))
                continue
            for name, child in node.children().items():
                self.say(name + ("/" if child.is_dir else ""))

    def do_cd(self, arg: str) -> None:
        """cd [PATH]: change the working directory (default /)."""
        args = self._args(arg)
        path = self.absolute(args[0] if args else "/")
        if not self.lookup(path).is_dir:
            raise ShellError(f"{path}: not a directory")
        self.cwd = path

    def do_pwd(self, arg: str) -> None:
        """pwd: print the working directory."""
        self.say(self.cwd)

    def do_cat(self, arg: str) -> None:
        """cat PATH...: print a file's value, or a directory's files as key: value lines."""
        paths = self._args(arg)
        if not paths:
            raise ShellError("cat needs a PATH")
        for p in paths:
            node = self.lookup(self.absolute(p))
            if not node.is_dir:
                self.say(output.cell(node.value))
                continue
            children = node.children()
            pairs = [(k, c.value) for k, c in children.items() if not c.is_dir]
            if pairs:
                self.say(output.render_kv(pairs))
            subdirs = [k + "/" for k, c in children.items() if c.is_dir]
            if subdirs:
                self.say(" ".join(subdirs))

    def do_find(self, arg: str) -> None:
        """find [PATH] [-name GLOB]: every path under PATH (matching GLOB on its last part)."""
        args = self._args(arg)
        pattern = None
        if "-name" in args:
            i = args.index("-name")
            if i + 1 >= len(args):
                raise ShellError("find: -name needs a pattern")
            pattern = args[i + 1]
            del args[i : i + 2]
        start = self.absolute(args[0] if args else None)
        for path, _node in self._walk(start, self.lookup(start)):
            if pattern is None or fnmatch.fnmatchcase(posixpath.basename(path), pattern):
                self.say(path)

    def _walk(self, path: str, node: Node) -> Iterator[tuple[str, Node]]:
        yield path, node
        if node.is_dir:
            for name, child in node.children().items():
                yield from self._walk(posixpath.join(path, name), child)

    def do_tree(self, arg: str) -> None:
        """tree [PATH]: the directory tree under PATH with file values."""
        path = self.absolute(next(iter(self._args(arg)), None))
        node = self.lookup(path)
        self.say(path)
        self._tree(node, "")

    def _tree(self, node: Node, indent: str) -> None:
        if not node.is_dir:
            return
        items = list(node.children().items())
        for i, (name, child) in enumerate(items):
            last = i == len(items) - 1
            branch = "`-- " if last else "|-- "
            label = name + "/" if child.is_dir else f"{name}: {output.cell(child.value)}"
            self.say(indent + branch + label)
            self._tree(child, indent + ("    " if last else "|   "))

    def do_history(self, arg: str) -> None:
        """history [PATH]: records that touched the node at PATH, with offsets and provenance."""
        path = self.absolute(next(iter(self._args(arg)), None))
        shown = 0
        for batch, i, record, touched in touched_paths(self.batches, self.known_names):
            if related(path, touched):
                self.say(render_item(record_item(batch, i, record)))
                shown += 1
        if not shown:
            self.say(f"no records touched {path} in this history")

    def do_help(self, arg: str) -> None:
        """help [COMMAND]: list the commands, or show one command's usage."""
        if arg:
            fn = getattr(self, f"do_{arg.strip()}", None)
            if fn is None:
                raise ShellError(f"no command {arg.strip()!r}")
            self.say(fn.__doc__ or "")
            return
        self.say(f"image at offset {self.image.offset} from {self.source}")
        for name in ("ls", "cd", "pwd", "cat", "find", "tree", "history", "help", "exit"):
            self.say("  " + (getattr(self, f"do_{name}").__doc__ or name))

    def do_exit(self, arg: str) -> bool:
        """exit: leave the shell (also quit, Ctrl-D)."""
        return True

    do_quit = do_exit

    def do_EOF(self, arg: str) -> bool:
        self.say()
        return True

    def completedefault(self, text: str, line: str, begidx: int, endidx: int) -> list[str]:
        """Complete paths."""
        base, _, partial = text.rpartition("/")
        try:
            node = self.lookup(self.absolute(base or (None if not text.startswith("/") else "/")))
            names = node.children() if node.is_dir else {}
        except ShellError:
            return []
        prefix = base + "/" if base or text.startswith("/") else ""
        return [
            prefix + n + ("/" if c.is_dir else "")
            for n, c in names.items()
            if n.startswith(partial)
        ]


def split_commands(script: str) -> list[str]:
    """``"ls /topics; cat /topics/a/0"`` → the non-empty commands (``;`` inside quotes kept)."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=";")
    lexer.whitespace_split = True
    out: list[str] = []
    words: list[str] = []
    for token in lexer:
        if set(token) == {";"}:  # ";" and runs like ";;"
            if words:
                out.append(shlex.join(words))
            words = []
        else:
            words.append(token)
    if words:
        out.append(shlex.join(words))
    return out
