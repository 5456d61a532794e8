"""The controller quorum: PySyncObj behind a trio API (``RaftQuorum``), group commit and a
durable journal. ``kraft.quorum.raft`` is the only module in pykraft that imports pysyncobj."""
from kraft.quorum.raft import ApplyTarget, RaftQuorum, RaftSettings

__all__ = ["ApplyTarget", "RaftQuorum", "RaftSettings"]
