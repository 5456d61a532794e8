"""Benchmarks for the pykraft controller (``python -m bench.run_all``)."""
