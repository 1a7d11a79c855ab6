"""Shared hosts (issue 21): the per-device ledger of a host pod and the placement decisions over it.

Pure (no Kopf, no I/O): ``ledger`` charges each model on a host (``ledger``, ``fits``), ``decide`` picks
what sleeps, what is unloaded and where a new replica goes (``make_room``, ``unload_candidates``,
``wake``, ``sleep``, ``place``), ``charge`` says what a host pod costs the ModelBudget, and ``status``
writes a ModelHost's status. The operator's passes observe the hosts into ``Host`` values, call these,
and apply the answers. Each name is imported from its module (the package re-exports none).
"""
