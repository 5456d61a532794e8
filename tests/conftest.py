"""Shared pytest set-up: the repository root on ``sys.path`` (tests import ``tests.harness``)."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
