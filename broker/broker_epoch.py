"""The broker epoch a broker's disks belong to, kept in each log dir (``broker.epoch``).

After each registration the broker writes its new epoch into every log dir, with the machine's
boot id. A later process of the broker reads it back and sends it as ``previous_broker_epoch``
(Kafka's ``PreviousBrokerEpoch``, KIP-966): when it equals the epoch of the registration the
controllers still hold as unfenced, every one of the broker's disks is the one that registration
served from, so the controllers replace the registration without moving the broker's
leaderships and ISR places (see ``kraft.controller.cluster_control.register_broker``).

That is only safe while the logs hold everything that registration's process appended. Its
appends are not fsynced (as Kafka's, ``log.flush.*`` unset): a process that died keeps them in
the page cache, but a machine that rebooted (an OS crash, a power loss) may have lost the
unflushed tail, and a leader that kept its leadership with a shorter log would make its
followers truncate acknowledged records. So the epoch counts only on the boot that wrote it
(``/proc/sys/kernel/random/boot_id``). A wiped or re-formatted dir has no file, an unreadable
one gives none, and dirs that disagree prove nothing: the broker then sends -1 and goes through
the fence, as a new disk must.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from kraft.storage.meta_properties import write_atomically

log = logging.getLogger(__name__)

EPOCH_FILE = "broker.epoch"
NO_EPOCH = -1
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id(source: Path = BOOT_ID) -> str:
    """This boot of the machine ("" when the system does not say)."""
    try:
        return source.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def read_previous_epoch(log_dirs: Iterable[Path], boot: str) -> int:
    """The epoch every one of ``log_dirs`` holds, written during boot ``boot``; else -1 (no
    dirs, a file missing, unreadable or malformed, dirs that disagree, another boot, or no
    boot id known)."""
    found: set[int] = set()
    dirs = list(log_dirs)
    for d in dirs:
        try:
            fields = (Path(d) / EPOCH_FILE).read_text(encoding="ascii").split()
        except (OSError, UnicodeDecodeError):
            return NO_EPOCH
        if len(fields) != 2 or not fields[0].isdigit():
            log.warning("%s holds %r, not a broker epoch; registering as a new disk", d, fields)
            return NO_EPOCH
        if not boot or fields[1] != boot:
            log.info(
                "%s was written before the machine last booted: its unflushed tail may be lost, "
                "so this broker registers as a new disk",
                d,
            )
            return NO_EPOCH
        found.add(int(fields[0]))
    return found.pop() if len(found) == 1 and dirs else NO_EPOCH


def write_epoch(log_dirs: Iterable[Path], epoch: int, boot: str) -> bool:
    """Record ``epoch`` and ``boot`` in every one of ``log_dirs`` (atomically, fsynced); False
    when one could not be written (the next process then registers as a new disk: slower,
    never unsafe)."""
    ok = True
    for d in log_dirs:
        try:
            write_atomically(Path(d) / EPOCH_FILE, f"{epoch} {boot or '-'}\n")
        except OSError as e:
            log.warning("could not record broker epoch %d in %s: %s", epoch, d, e)
            ok = False
    return ok
