"""The soak (``make soak``, ``python -m bench.soak``): MiniLM pools on the process node and KWOK pools,
polite and rude clients through the gateway, faults from a seeded schedule every few seconds, and an
auditor with its own watches that checks the operator's invariants at every event (docs/benchmarks.md,
"Soak").

Modules: ``schedule`` (pure: seed -> faults), ``faults`` (the actions and when each was active), ``rig``
(the cluster and the processes the faults kill), ``clients``, ``auditor``, ``rss``, ``report``; the run
itself is ``__main__.run``."""
