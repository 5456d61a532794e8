"""The controller quorum: PySyncObj behind a trio API (``RaftQuorum``), group commit and a
durable journal. ``kraft.quorum.raft``, its ``trio_ticker`` and ``pysyncobj_patches`` (every
patch of PySyncObj, applied at start-up) are the only modules in pykraft that import pysyncobj."""

from kraft.quorum.raft import ApplyTarget, RaftQuorum, RaftSettings

__all__ = ["ApplyTarget", "RaftQuorum", "RaftSettings"]
