"""Cluster metadata as every reader of the log sees it: registrations, the partition map, the
image, the delta, checksums, :func:`~kraft.metadata.replay.replay` and the log follower.

Import from the modules (``kraft.metadata.image`` and so on); this package re-exports nothing.
"""
