"""Where effects are applied: everything a reconciliation pass does to the cluster.

* ``apply``: the one entry point of a pass's effects (``apply`` a plan, ``refuse`` a spec, the reservations'
  checks, the ModelBudget's status).
* ``kube``: the handful of API calls besides Kopf's watching (one request each).
* ``budget_object``: the ModelBudget created at startup when missing (``budget_create``), never touched again.
* ``events``: the ``EventSink`` interface Events are posted through.
* ``resources``, ``network_policy`` (with ``network_peers``, the peer type its settings accept): the pure
  builders of the objects those calls send (the worker Pod, the headless Service, the NetworkPolicy).

Nothing here observes the cluster (``observe``) or decides what it should look like (``planner``).
"""
