"""The test kit: the tooling tests/, e2e/, bench/, hack/ scripts and the root conftest.py share, defined once.

Imports go one way: those import from ``testkit``; ``testkit`` imports nothing from tests/, e2e/, bench/
or hack/ (it may use the product packages' contracts, ``modelpool_contract``).  Not part of the product:
no image contains it.

Modules:

* ``environment``: where the repository and the control-plane binaries are, CI or not, a free port, the
  environment of the benchmarks' child processes.
* ``cluster``: the local control plane's lifecycle (``Cluster``, ``start_cluster``/``stop_cluster`` through
  ``hack/cluster.sh``, prerequisites, ``guarded_cluster`` for benchmarks).
* ``kubectl``: the one kubectl/helm wrapper, ``wait_for``, ``apply``/``get_json``/``wait_established``,
  process-node pod manifests, hostPath PersistentVolumes.
* ``watch``: the one list-then-watch loop every watcher of cluster objects is built on.
* ``loopback``: the pod-IP loopback guard (``python -m testkit.loopback``).
* ``load``: the load generator (raw keep-alive HTTP/1.1 clients; ``python -m testkit.load``) and the
  threaded closed loop through the gateway or to workers.
* ``corpus``: the deterministic sentences the load sends.
* ``prom``: Prometheus text exposition read with prometheus_client's parser.
* ``prometheus``: a real Prometheus server on loopback scraping given targets and evaluating rule files.
* ``dashboards``: the Grafana dashboards the chart ships, defined once (``python -m testkit.dashboards
  [--write]``; ``e2e/test_monitoring.py``).
* ``layout``: what a module imports, read from its source (the layout tests).
* ``services``: the operator and the gateway as real processes (``OperatorProcess``, ``GatewayProcess``),
  gateway keys, pool and budget manifests, a pool's pods and their process-node processes.
* ``server``: ``modelpool-server`` as a child process (``ServerProcess``, ``launch``): the server tests'
  ``start_server`` and the benchmarks' ``minilm_server`` are built on it.
* ``echo_models``: the echo models, ``Task`` classes without weights whose load and forward pass the
  environment slows, gates or fails (the server imports them by ``--handler``: ``ECHO``, ``GENERATION``).
* ``tiny_models``: random tiny models of every task built from configs, offline, in the real folder
  layouts (the server tests, the generation benchmark; ``python -m testkit.tiny_models``).
* ``processnode``: the process node, a kubelet-like agent running pods as local processes
  (``python -m testkit.processnode``; ``hack/cluster.sh`` starts it).
* ``docs``: the documents checked against the code (flags, chart values, metric names, CRD fields) and the
  generated docs/values.md (``python -m testkit.docs [--write]``; ``tests/test_docs_drift.py``).
"""
