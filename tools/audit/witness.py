"""Witnesses outside the audited log: the other controllers' logs (``--log-dir`` given more
than once) and the head an earlier audit verified (its ``findings.json``).

A log alone cannot show a rewrite that keeps its own chain consistent (every batch after a
removed one re-numbered and re-chained) or a cut at a batch boundary of its newest segment.
Another copy can: each controller holds the same history, so their chains must agree on
every offset both hold. So can the past: each audit records the head it verified (the newest
intact batch's last offset and hash); a later audit fails if the batch ending there now
hashes differently (the hash chain makes that hash stand for every batch before it) or is
gone. Pure Python on the driver, no Spark.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tools.audit.integrity import ERROR, WARNING, Finding, Integrity


class PreviousError(Exception):
    """An earlier audit's findings.json given explicitly cannot be used."""


def previous_head(explicit: Path | None, default: Path, log_dir: Path) -> dict[str, Any] | None:
    """The head an earlier audit verified: from ``explicit`` (an error when unusable), else
    from ``default`` (the output directory's last findings.json) when it audited the same
    directory (ignored when unusable)."""
    path = explicit or default
    try:
        doc = json.loads(path.read_text())
        head = doc.get("verified_head")
        if head is not None and (type(head.get("offset")) is not int or not head.get("hash")):
            raise ValueError("its verified_head has no offset and hash")
    except (OSError, ValueError, AttributeError) as e:
        if explicit is not None:
            raise PreviousError(
                f"cannot use {explicit} as an earlier audit's findings: {e}"
            ) from None
        return None
    if explicit is None and Path(str(doc.get("log_dir"))).resolve() != log_dir.resolve():
        return None
    if head is None and explicit is not None:
        raise PreviousError(f"{explicit} records no verified head")
    return head if isinstance(head, dict) else None


def against_previous(scan: Integrity, head: dict[str, Any]) -> list[Finding]:
    """The audited log against the head an earlier audit verified."""
    offset, expected = head["offset"], head["hash"]
    now = scan.head
    if now is None or now["offset"] < offset:
        ends = "holds no intact batch" if now is None else f"ends at offset {now['offset']}"
        return [
            Finding(
                "history-unchanged",
                ERROR,
                head.get("file"),
                None,
                offset,
                f"the log {ends}, before offset {offset} that an earlier audit verified: "
                "history was truncated",
            )
        ]
    got = scan.hash_at(offset)
    if got == expected:
        return []
    what = (
        "no batch ends there any more"
        if got is None
        else f"the batch ending there hashes to {got[:16]}…"
    )
    return [
        Finding(
            "history-unchanged",
            ERROR,
            head.get("file"),
            None,
            offset,
            f"an earlier audit verified offset {offset} with hash {expected[:16]}…; {what}: "
            "the history up to it was changed",
        )
    ]


def compare(scan: Integrity, others: list[Integrity]) -> list[Finding]:
    """The audited log against each other controller's: the first offset where their chains
    differ, and an audited log shorter than a witness (it lost records the witness holds)."""
    found = []
    for other in others:
        theirs = {b.last: b for b in other.batches}
        first_diff = next(
            (b for b in scan.batches if b.last in theirs and theirs[b.last].hash != b.hash),
            None,
        )
        if first_diff is not None:
            found.append(
                Finding(
                    "witness-agrees",
                    ERROR,
                    first_diff.file,
                    first_diff.position,
                    first_diff.base,
                    f"the batch {first_diff.base}..{first_diff.last} hashes to "
                    f"{first_diff.hash.hex()[:16]}… here, to "
                    f"{theirs[first_diff.last].hash.hex()[:16]}… in {other.log_dir}: "
                    "the histories differ from here on",
                )
            )
        a, b = scan.head, other.head
        if b is not None and (a is None or a["offset"] < b["offset"]):
            found.append(
                Finding(
                    "witness-agrees",
                    ERROR,
                    None if a is None else a["file"],
                    None,
                    None if a is None else a["offset"] + 1,
                    f"the log ends at offset {None if a is None else a['offset']}, "
                    f"{other.log_dir} holds up to {b['offset']}: the audited log lost "
                    "records another controller holds",
                )
            )
        elif a is not None and (b is None or b["offset"] < a["offset"]):
            found.append(
                Finding(
                    "witness-agrees",
                    WARNING,
                    None,
                    None,
                    None if b is None else b["offset"] + 1,
                    f"{other.log_dir} ends at offset {None if b is None else b['offset']}, "
                    f"the log at {a['offset']}: that controller lags (or lost records)",
                )
            )
    return found


def record(
    findings: dict[str, Any],
    scan: Integrity,
    others: list[Integrity],
    previous: dict[str, Any] | None,
) -> None:
    """Write into findings.json the head this audit read, every witness's, and the head the
    next audit checks against: this one's when the log's structure verified (no error from
    the structure checks), else the earlier verified head, kept."""
    structural = {
        r["rule"] for r in findings["rules"] if r["errors"] and r["rule"] in _STRUCTURE_RULES
    }
    findings["head"] = scan.head
    findings["witnesses"] = [
        {"log_dir": o.log_dir, "head": o.head, "records": o.records} for o in others
    ]
    findings["previous_head"] = previous
    findings["verified_head"] = previous if structural else scan.head


def _structure_rules() -> frozenset[str]:
    from tools.audit.integrity import RULES

    return frozenset(RULES) | {"snapshot-matches-log", "state-replays"}


_STRUCTURE_RULES = _structure_rules()
