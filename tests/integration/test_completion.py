"""``kraft completion bash|zsh``: the generated script, sourced by a real bash (and zsh when
installed), completes commands, sub-commands, options, option choices and directories."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
from pathlib import Path

import pytest

from tools import cli
from tools.completion import command_tree


def generated(shell: str) -> str:
    """What ``kraft completion SHELL`` prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["completion", shell]) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("completion") / "kraft.bash"
    path.write_text(generated("bash"))
    return path


def complete(script: Path, line: str, cwd: Path | None = None) -> list[str]:
    """What bash offers for ``line`` (the cursor at its end; a trailing space = a new word)."""
    words = line.split()
    if line.endswith(" "):
        words.append("")
    array = " ".join(f"'{w}'" for w in words)
    program = (
        f"source '{script}'; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; "
        "_kraft_complete; printf '%s\\n' \"${COMPREPLY[@]}\""
    )
    proc = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stderr
    return sorted(w for w in proc.stdout.splitlines() if w)


def test_tree_is_built_from_the_parser() -> None:
    tree = command_tree(cli.build_parser())
    assert {"cluster", "quorum", "topics", "configs", "completion"} <= set(tree[""].subcommands)
    assert tree["quorum"].subcommands == ["status", "replication"]
    assert tree["cluster up"].values["--fsync"] == "always never"
    assert tree["cluster up"].values["--dir"] == "@dir"
    assert "--detach" not in tree["cluster up"].values  # a flag takes no value
    assert tree["controller"].values["--config"] == "@file"


def test_every_command_that_reports_has_json() -> None:
    """--json everywhere: every leaf command but the node runners, the interactive shell and the
    completion script (its output is a script) offers --json."""
    tree = command_tree(cli.build_parser())
    leaves = {
        p for p, i in tree.items() if p and not [s for s in i.subcommands if f"{p} {s}" in tree]
    }
    without = {p for p in leaves if "--json" not in tree[p].options}
    assert without == {"controller", "broker", "shell", "completion"}


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completes_commands_options_choices_and_dirs(script: Path, tmp_path: Path) -> None:
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert complete(script, "kraft qu") == ["quorum"]
    assert complete(script, "kraft quorum ") == ["replication", "status"]
    assert complete(script, "kraft cluster up --fs") == ["--fsync"]
    assert complete(script, "kraft cluster up --fsync ") == ["always", "never"]
    assert complete(script, "kraft cluster up --dir ./c --controllers 3 --fsync n") == ["never"]
    assert complete(script, "kraft completion ") == ["bash", "zsh"]
    assert "--replication-factor" in complete(script, "kraft topics create t --rep")
    (tmp_path / "clusterdir").mkdir()
    (tmp_path / "afile").write_text("")
    assert complete(script, "kraft quorum status --cluster cl", cwd=tmp_path) == ["clusterdir"]
    # a value that looks like a sub-command name is not taken for one
    assert complete(script, "kraft cluster status --dir status --j") == ["--json"]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_script_loads() -> None:
    proc = subprocess.run(
        ["zsh", "-f", "-c", generated("zsh") + "\nwhence -w _kraft_complete"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0 and "function" in proc.stdout, proc.stderr


# ---- progress ---------------------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_only_on_a_terminal() -> None:
    from tools.cluster import Readiness
    from tools.commands.cluster_cmd import Progress

    piped = io.StringIO()
    progress = Progress(piped)
    progress(Readiness(), 0.5)
    progress.done()
    assert piped.getvalue() == ""

    tty = _Terminal()
    progress = Progress(tty)
    progress(Readiness(), 0.5)
    progress(Readiness(leader_id=1, term=1, controllers_with_leader={1}), 1.25)
    progress.done()
    frames = tty.getvalue().split("\r")
    assert frames[1].startswith("Waiting for the cluster: quorum: no leader yet [0.5s]")
    assert frames[2].rstrip() == "Waiting for the cluster: quorum: leader 1 (term 1) [1.2s]"
    assert len(frames[2]) >= len(frames[1].rstrip())  # the longer old line is overwritten
    assert frames[3].strip() == "" and frames[4] == ""  # cleared, cursor back at the start
