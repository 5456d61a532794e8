"""The broker epoch a broker's disks belong to, kept in each log dir (``broker.epoch``).

After each registration the broker writes its new epoch into every log dir. A later process of
the broker reads it back and sends it as ``previous_broker_epoch`` (Kafka's
``PreviousBrokerEpoch``, KIP-966): when it equals the epoch of the registration the controllers
still hold as unfenced, every one of the broker's disks is the one that registration served
from, so the controllers replace the registration without moving the broker's leaderships and
ISR places (see ``kraft.controller.cluster_control.register_broker``). A wiped or re-formatted
dir has no file, a dir that cannot be read gives none, and dirs that disagree prove nothing: the
broker then sends -1 and goes through the fence, as a new disk must.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from kraft.storage.meta_properties import write_atomically

log = logging.getLogger(__name__)

EPOCH_FILE = "broker.epoch"
NO_EPOCH = -1


def read_previous_epoch(log_dirs: Iterable[Path]) -> int:
    """The epoch every one of ``log_dirs`` holds, or -1 (no dirs, a file missing, unreadable,
    malformed, or dirs that disagree)."""
    found: set[int] = set()
    dirs = list(log_dirs)
    for d in dirs:
        try:
            text = (Path(d) / EPOCH_FILE).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            return NO_EPOCH
        if not text.isdigit():
            log.warning("%s holds %r, not a broker epoch; registering as a new disk", d, text)
            return NO_EPOCH
        found.add(int(text))
    return found.pop() if len(found) == 1 and dirs else NO_EPOCH


def write_epoch(log_dirs: Iterable[Path], epoch: int) -> bool:
    """Record ``epoch`` in every one of ``log_dirs`` (atomically, fsynced); False when one could
    not be written (the next process then registers as a new disk: slower, never unsafe)."""
    ok = True
    for d in log_dirs:
        try:
            write_atomically(Path(d) / EPOCH_FILE, f"{epoch}\n")
        except OSError as e:
            log.warning("could not record broker epoch %d in %s: %s", epoch, d, e)
            ok = False
    return ok
