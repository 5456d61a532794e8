"""Keep the ``kraft`` command's processes from importing test libraries.

kio (the Kafka protocol types) imports ``hypothesis`` when it is installed, to register test
strategies, and hypothesis brings in trio's and pytest's test helpers. Where the test extras are
installed (a development venv, CI) that made every controller, broker and CLI process import a
test framework it never uses, and create a ``.hypothesis`` directory in its working directory.
A process that is not running under pytest marks hypothesis as absent before kio is imported;
kio then skips its strategies, as it does where hypothesis is not installed.
"""

from __future__ import annotations

import sys


def skip_test_libraries() -> None:
    """Mark hypothesis as not importable, unless pytest runs in this process."""
    if "pytest" not in sys.modules and "hypothesis" not in sys.modules:
        sys.modules["hypothesis"] = None  # type: ignore[assignment]  # None: "not importable"


skip_test_libraries()
