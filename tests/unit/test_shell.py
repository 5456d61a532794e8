"""The metadata shell on synthetic logs written by the real state machine: the tree, every
command, history of a node, ``--at-offset`` and ``-c`` scripts. (Live ``--cluster`` mode and a
running controller's directory are in test_log_tools_cluster.py.)"""

from __future__ import annotations

import io

import pytest

from testsupport.sample_log import write_history
from tools.cli import main
from tools.log_reader import History
from tools.metadata_shell import MetadataShell, split_commands


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write_history(tmp_path_factory.mktemp("log") / "log", segment_bytes=1500)


@pytest.fixture(scope="module")
def history(written):
    return History.load(written.directory)


def shell_at(
    history: History, offset: int | None = None
) -> tuple[MetadataShell, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    count = len(history.batches) if offset is None else history.batch_index_through(offset)
    shell = MetadataShell(
        history.image_at(offset), history.batches[:count], "test", stdout=out, stderr=err
    )
    return shell, out, err


def run(shell_out_err, script: str) -> list[str]:
    shell, out, err = shell_out_err
    out.seek(0), out.truncate()
    assert shell.run_script(script), err.getvalue()
    return out.getvalue().splitlines()


def test_tree_layout_and_values(written, history):
    s = shell_at(history)
    image = written.images["deleted"]
    assert run(s, "ls") == ["brokers/", "topics/", "configs/", "features/", "image/"]
    assert run(s, "ls /topics") == ["orders/"]  # scratch was deleted
    assert run(s, "ls /brokers") == ["101/", "102/", "103/"]
    assert run(s, "ls /topics/orders") == ["topic_id", "0/", "1/", "2/"]
    p0 = image.topic("orders").partitions[0]
    lines = run(s, "cat /topics/orders/0")
    assert f"leader:                {p0.leader}" in lines
    assert "isr:                   " + ",".join(map(str, p0.isr)) in lines
    assert run(s, "cat /topics/orders/0/leader_epoch") == [str(p0.leader_epoch)]
    assert run(s, "cat /configs/topics/orders/retention.ms") == ["5000"]
    assert run(s, "cat /features/metadata.version") == ["2"]
    assert run(s, "cat /brokers/102/state /brokers/102/rack") == ["unfenced", "r0"]
    assert f"checksum:         {image.checksum()}" in run(s, "cat /image")
    assert f"offset:           {image.offset}" in run(s, "cat /image")


def test_navigation_find_and_tree(history):
    s = shell_at(history)
    assert run(s, "cd /topics/orders; pwd; cd 1; pwd; cat isr; cd ../..; pwd; cd; pwd") == [
        "/topics/orders",
        "/topics/orders/1",
        run(s, "cat /topics/orders/1/isr")[0],
        "/topics",
        "/",
    ]
    assert run(s, "find /configs") == [
        "/configs",
        "/configs/topics",
        "/configs/topics/orders",
        "/configs/topics/orders/retention.ms",
        "/configs/brokers",
    ]
    assert run(s, "find / -name leader") == [f"/topics/orders/{p}/leader" for p in range(3)]
    tree = run(s, "tree /brokers/101")
    assert tree[0] == "/brokers/101" and "|-- state: unfenced" in tree
    assert tree[-1] == "`-- features: -"  # the synthetic brokers declare none


def test_errors_fail_the_script_and_change_nothing(history):
    shell, out, err = shell_at(history)
    assert not shell.run_script(
        "cd /topics; cat /nope; ls /topics/orders/0/leader/x; frobnicate; cat"
    )
    assert err.getvalue().splitlines() == [
        "error: /nope: no such node",
        "error: /topics/orders/0/leader/x: not a directory",
        "error: unknown command 'frobnicate' (try 'help')",
        "error: cat needs a PATH",
    ]
    assert shell.cwd == "/topics"
    assert not shell.run_script("cd /topics/orders/0/leader") and shell.cwd == "/topics"


def test_history_of_a_node(written, history):
    s = shell_at(history)
    lines = run(s, "history /topics/orders/2")
    offsets = [int(line.split()[1]) for line in lines]
    assert offsets[0] == written.offset("brokers") + 1  # the TopicRecord (node above)
    assert "PartitionRecord partition_id=2" in lines[1]
    fence_batch = range(written.offset("configured") + 1, written.offset("fenced"))
    assert int(lines[-1].split()[1]) in fence_batch  # the fence's change of partition 2
    assert "controller FenceBroker (session-timeout): PartitionChangeRecord" in lines[-1]
    config = run(s, "history /configs/topics/orders")
    assert len(config) == 2 and all(
        "User:bob/ops-tool IncrementalAlterConfigs" in line for line in config
    )
    broker = run(s, "history /brokers/101")
    assert [line.split("): ")[1].split()[0] for line in broker] == [
        "RegisterBrokerRecord",
        "BrokerRegistrationChangeRecord",
        "BrokerRegistrationChangeRecord",
        "BrokerRegistrationChangeRecord",
    ]
    assert run(s, "history /features/nothing") == [
        "no records touched /features/nothing in this history"
    ]


def test_at_offset_reproduces_an_earlier_state(written, history):
    fenced = written.images["fenced"]
    s = shell_at(history, fenced.offset)
    assert run(s, "ls /topics") == ["orders/", "scratch/"]
    assert run(s, "cat /brokers/101/state") == ["fenced"]
    assert run(s, "cat /image/checksum") == [fenced.checksum()]
    assert len(run(s, "history /brokers/101")) == 3  # the unfence after it is not in this history
    early = shell_at(history, written.offset("brokers"))
    assert run(early, "ls /topics") == [] and run(early, "ls /configs/topics") == []


def test_cli_c_at_offset_and_usage_errors(written, capsys):
    d = str(written.directory)
    assert main(["shell", d, "-c", "ls /topics; cat /topics/orders/1/leader"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["orders/", str(written.images["deleted"].topic("orders").partitions[1].leader)]
    assert (
        main(
            [
                "shell",
                d,
                "--at-offset",
                str(written.offset("fenced")),
                "-c",
                "cat /brokers/101/state",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == "fenced\n"
    assert main(["shell", d, "-c", "cat /nope"]) == 1
    assert main(["shell", d, "--at-offset", "999", "-c", "ls"]) == 2
    assert "beyond the last offset" in capsys.readouterr().err
    assert main(["shell", d, "--cluster", d, "-c", "ls"]) == 2
    assert main(["shell", str(written.directory / "missing"), "-c", "ls"]) == 2


def test_commands_piped_on_stdin(written, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("cd /topics/orders\n\nls\n"))
    assert main(["shell", str(written.directory)]) == 0
    assert capsys.readouterr().out.splitlines() == ["topic_id", "0/", "1/", "2/"]


def test_path_completion(history):
    shell, _, _ = shell_at(history)
    assert shell.completedefault("/topics/or", "cd /topics/or", 3, 13) == ["/topics/orders/"]
    assert shell.completedefault("/f", "ls /f", 3, 5) == ["/features/"]
    shell.run_line("cd /topics/orders")
    assert shell.completedefault("0/leader_", "cat 0/leader_", 4, 13) == [
        "0/leader_epoch",
        "0/leader_recovery_state",
    ]
    assert shell.completedefault("nope/x", "cat nope/x", 4, 10) == []


def test_split_commands():
    assert split_commands("ls /topics; cat '/a;b' ;;  pwd") == ["ls /topics", "cat '/a;b'", "pwd"]
