"""The replay's breaks (:class:`tools.audit.state.Gap`) in findings.json: each under the root
cause the structure scan found for it, with the batches after it that did not fit the image
counted as that cause's consequences (``state-replays``), never as independent errors.

A batch that does not fit an image the replay rebuilt exactly (no break before it: the log's
own records contradict each other) is a root cause of its own, and the batches after it that
do not fit either are its consequences. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from tools.audit.integrity import ERROR, Region, cause_of

RULE = "state-replays"
MAX_SAMPLES = 20
RULES: dict[str, tuple[str, str]] = {
    RULE: (
        ERROR,
        "every batch fits the image the log before it rebuilds (after a gap: the image "
        "without the lost batches, and a batch that does not fit is the gap's consequence)",
    ),
}


def _region_cause(causes: list[dict[str, Any]], region: Region) -> dict[str, Any] | None:
    f = region.finding
    for c in causes:
        if c.get("offsets") == [region.first, region.last] and (
            c["rule"],
            c["file"],
            c["position"],
            c["offset"],
        ) == (f.rule, f.file, f.position, f.offset):
            return c
    return None


def attach(
    findings: dict[str, Any],
    regions: list[Region],
    gaps: list[dict[str, Any]],
    approximate: str | None,
) -> None:
    """Put the replay's ``gaps`` (``Gap.as_dict()``) into ``findings``: under their root
    causes (``root_causes``, from the scan's ``regions``) or as root causes of their own, the
    ``state-replays`` rule's counts and samples, ``replay`` (the gaps and why the end image is
    approximate) and the status."""
    causes: list[dict[str, Any]] = findings.setdefault("root_causes", [])
    rule = next(r for r in findings["rules"] if r["rule"] == RULE)
    own = consequences = 0
    for gap in gaps:
        first = gap["offsets"][0]
        unfit = gap["unfit_batches"]
        region = None if gap["why"].startswith("a batch does not fit") else cause_of(regions, first)
        cause = _region_cause(causes, region) if region is not None else None
        is_own = cause is None
        if cause is None:  # the replay's own root cause: its first unfit batch, if any
            own += 1 if unfit else 0
            cause = {
                "rule": RULE,
                "severity": ERROR,
                "file": None,
                "position": None,
                "offset": first,
                "detail": f"{gap['why']}; the replay went on {gap['resumed']}",
                "offsets": gap["offsets"],
                "consequences": {},
            }
            causes.append(cause)
            after = unfit - 1 if unfit else 0
        else:
            after = unfit
        consequences += after
        cause.setdefault("replay", []).append(gap)
        if after:
            cause["consequences"][RULE] = cause["consequences"].get(RULE, 0) + after
        for s in gap["samples"]:
            if len(rule["samples"]) < MAX_SAMPLES:
                rule["samples"].append(
                    {
                        "offset": s["offset"],
                        "severity": ERROR,
                        "detail": f"batch at {s['offset']} skipped: {s['error']}",
                        "consequence": not is_own or s["offset"] != first,
                    }
                )
    total = own + consequences
    rule.update(
        count=total,
        errors=total,
        severity=ERROR,
        passed=total == 0,
        consequences=consequences,
        root_causes=own,
    )
    findings["replay"] = {"gaps": gaps, "approximate": approximate}
    causes.sort(
        key=lambda c: (c["severity"] != ERROR, c["offset"] if c["offset"] is not None else -1)
    )
    if any(r["errors"] for r in findings["rules"]):
        findings["status"] = "failed"
