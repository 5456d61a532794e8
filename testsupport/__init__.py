"""Support code for the tests, the benches and build steps, kept out of the installed package.

Importable with the repository root on ``sys.path`` (``tests/conftest.py`` puts it there;
``python -m bench.…`` and ``python -m testsupport.…`` run from the root). Installed code
(``kraft``, ``broker``, ``tools``) never imports it (an import-linter contract).

* ``sim_broker`` — simulated brokers: ``python -m testsupport.sim_broker --cluster DIR --count N``.
* ``sample_log`` — a small, realistic metadata log written by the real state machine.
* ``classdata_train`` — the audit run whose JVM writes the audit's class archive.
* ``image_corrupter`` — a real broker whose metadata image a test corrupts on demand
  (``python -m testsupport.image_corrupter --trigger FILE CONFIG``; broker image checks).
"""
