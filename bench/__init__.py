"""``make bench``: the server benchmark (``python -m bench.server``) and the control-plane scale benchmark
(``python -m bench.controlplane``), with the pieces they are built from.

Server benchmark modules: ``minilm`` (the model under test: packaged or random weights), ``references``
(the model called directly, and sentence-transformers), ``server_process`` (the server under test as a
child process), ``rss`` (sampling its memory), ``report`` (the tables and the blocks of
docs/benchmarks.md, which
``controlplane`` writes through too).  The sentences, the load generator, the cluster and the
environment of child processes come from the test kit (``testkit.corpus``, ``testkit.load``,
``testkit.cluster``, ``testkit.environment``).
"""
