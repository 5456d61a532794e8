"""The interleaved bench's machine sample counts other processes' CPU, never the bench's own
or its children's (bench/interleave.py): a peer system runs as a child of the bench."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.interleave import MachineSample


def test_a_machine_sample_leaves_out_the_bench_and_its_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        others = MachineSample.read().others
        assert os.getpid() not in others and child.pid not in others
        assert os.getppid() in others  # the process that started pytest is another one
    finally:
        child.kill()
        child.wait(timeout=10)
