"""The worker's first process: the supervisor and its probe server.

``supervisor`` binds the listeners, starts the inference process (``model_server.engine``) and the HTTP
processes (``model_server.frontend``) by module name, restarts nothing and ends the worker when one of
them dies; ``probe_server`` answers the kubelet's probes and ``/metrics`` from the shared view, so they
answer whatever the other processes are doing.  It imports neither side's modules.

What more than one process imports stays at the top of ``model_server``: ``config``, ``errors``,
``ipc`` (the messages between the processes), ``worker_view`` (the shared memory), ``worker_stats``,
``metrics``, ``state_machine``, ``cpu_budget``, ``process_setup``, ``libc``, ``tasks/`` and ``main``.
"""
