"""The other voters' directory ids as this controller has seen them (``quorum-state.properties``).

Every formatting gives a directory a new random ``directory.id`` (``meta.properties``). A voter
that comes back with another one lost its disk: its journal, and the votes it cast, are gone,
so it could vote twice in a term or vote for a candidate missing committed entries. Each
controller records the id it first saw for every other voter; a voter presenting a different
one is *unverified*: its votes are not counted here (``RaftQuorum.unverified_voters``) until it
has applied at least what this controller had applied when it noticed the change, and is no
longer joining; then the new id is recorded. This holds even when the operator formatted the
wiped voter as a member of a new quorum by mistake.

Pure bookkeeping plus one small file; the controller feeds it what its peers' ``DescribeNode``
answers say (``kraft/controller_server.py``).
"""

from __future__ import annotations

from pathlib import Path

from kraft.storage.meta_properties import write_atomically

FILE = "quorum-state.properties"


class VoterDirectories:
    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / FILE
        self.recorded: dict[int, str] = {}
        self.unverified: dict[int, tuple[str, int]] = {}  # voter -> (new id, offset to reach)
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            text = ""
        for line in text.splitlines():
            key, sep, value = line.strip().partition("=")
            parts = key.split(".")
            if sep and len(parts) == 4 and parts[0] == "voter" and parts[1].isdigit():
                self.recorded[int(parts[1])] = value.strip()

    def _save(self) -> None:
        lines = [f"voter.{n}.directory.id={d}" for n, d in sorted(self.recorded.items())]
        write_atomically(self.path, "\n".join(lines) + "\n")

    def observe(
        self, voter: int, directory_id: str, applied_offset: int, joining: bool, own_applied: int
    ) -> str | None:
        """Take in what ``voter`` reports; returns "recorded", "changed", "verified" or None."""
        if not directory_id:
            return None
        known = self.recorded.get(voter)
        if known is None:
            self.recorded[voter] = directory_id
            self._save()
            return "recorded"
        if known == directory_id:
            self.unverified.pop(voter, None)
            return None
        pending = self.unverified.get(voter)
        if pending is None or pending[0] != directory_id:
            self.unverified[voter] = (directory_id, own_applied)
            return "changed"
        if not joining and applied_offset >= pending[1]:
            self.recorded[voter] = directory_id
            self._save()
            del self.unverified[voter]
            return "verified"
        return None
