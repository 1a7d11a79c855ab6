"""The server's first process: its process tree and its probe port.

``runtime`` binds the listeners, starts the inference processes (``model_server.engine``) and the HTTP
processes (``model_server.frontend``) by module name, restarts nothing and decides how the server ends;
``slot`` is one model's place in it; ``supervisor`` (a dedicated worker: one slot) and ``host`` (a shared
host: N slots and the control calls, ``host_control``) are its two shapes; ``probe_server`` answers the
kubelet's probes and ``/metrics`` from the shared views, whatever the other processes are doing.  It
imports neither side's modules.

What more than one process imports stays at the top of ``model_server``: ``config``, ``errors``,
``ipc`` (the messages between the processes), ``worker_view`` (the shared memory), ``worker_stats``,
``metrics``, ``state_machine``, ``cpu_budget``, ``process_setup``, ``libc``, ``tasks/`` and ``main``.
"""
