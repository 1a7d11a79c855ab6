"""``make bench``: the server benchmark (``python -m bench.server``) and the control-plane scale benchmark
(``python -m bench.controlplane``), with the pieces they are built from.

Server benchmark modules: ``corpus`` (the sentences), ``minilm`` (the model under test: packaged or
random weights), ``references`` (the model called directly, and sentence-transformers), ``loadgen`` (the
HTTP load generator, run in its own processes), ``server_process`` (the server under test as a child
process), ``rss`` (sampling its memory), ``report`` (the tables and the README blocks, which
``controlplane`` writes through too), ``environment`` (the repository and its child processes' environment).
"""
