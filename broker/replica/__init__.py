"""Replicas and their logs: partition logs, the replica manager, follower fetching, ISR."""
