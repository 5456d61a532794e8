"""The controller: pure logic that turns commands into metadata records.

Modules: ``commands`` (the replicated command), ``settings``, ``topic_names`` and ``configs``
(validation), ``placement`` (striped, rack-aware replica placement), ``election`` (leader election
rules: the partition change for a target ISR), ``heartbeats`` (broker liveness on the active
controller), the control managers and ``state_machine`` (:class:`QuorumStateMachine`).
Nothing here does I/O or reads a clock; time and randomness come in with each command.

Import from the submodules; this package deliberately imports nothing so that each module can be
used on its own.
"""
