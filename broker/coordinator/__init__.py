"""Coordinators on the brokers: FindCoordinator, and the group and transaction coordinators."""
