"""Entry point for ``spark-submit``: the same audit as ``kraft audit``, on the master that
spark-submit was given (e.g. ``spark-submit --master spark://h:7077 --py-files pykraft.zip
tools/audit/submit.py --log-dir /shared/log --out /shared/audit``). See README."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from tools.cli import main as cli_main

    args = list(sys.argv[1:] if argv is None else argv)
    return cli_main(["audit", "--master", "", *args])


if __name__ == "__main__":
    raise SystemExit(main())
