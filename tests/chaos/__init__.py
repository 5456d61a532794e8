"""Fault injection for pykraft: TCP proxies that partition nodes, a fault injector, a workload
through the real RPC client, and a history checker (``history.py``, pure)."""
