"""Where the cluster is observed: from Kopf's indices and the workers' ``/stats`` to plain values.

* ``observation``: the pods index to observed workers, by pool, and the memory ledger's inputs (the
  budget's limit, each pool's charges).
* ``worker_state``: one pod and its last ``/stats`` to one of the worker states, with a reason (pure).
* ``stats``: the ``/stats`` scraper (concurrent, bounded, never blocking a pass).

Nothing here decides what to do (``planner``) or changes the cluster (``effects``).
"""
