"""What every process of a worker that the supervisor starts does first.

* Ignore SIGTERM and SIGINT: the supervisor decides how the worker stops.  A pod's deletion (and the
  process node, and a terminal's Ctrl-C) signals the whole process group, and an HTTP process that
  stopped on its own would drop requests the inference process is still computing for it.  (The
  process starts with both blocked, so one that arrives before this runs does no harm either.)
* Die with the supervisor: Linux's parent-death signal (``PR_SET_PDEATHSIG``) SIGKILLs the process if
  the supervisor goes without stopping it (killed by the OOM killer, say), so no orphan holds the port
  or the device.
* A name that ``ps``/``top`` show (``PR_SET_NAME``: ``mp-inference``, ``mp-http-0``, ...).
* Its CPU priority (the HTTP processes run a little below the model: see ``http_process``).
* Logging, with the process's name on every line, in the worker's ``--log-format``
  (``modelpool_contract.logs``).

And what each does last: ``exit_now`` (the supervisor too).
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import multiprocessing
import os
import signal
import sys
from typing import Any

from model_server.config import ServingConfig
from model_server.libc import libc_function
from modelpool_contract import logs, tracing

#: The traces' service.name of every process of a worker (the spans' names tell the processes apart).
SERVICE_NAME = "modelpool-server"
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def start(module: str, *args: Any, **kwargs: Any) -> None:
    """The supervisor's spawn target: ``module.main(*args, **kwargs)``.  The supervisor names a module
    instead of handing over its ``main``, so it never imports the web stack or the model's code itself
    (spawn pickles a target by reference, and the parent must hold it to do so)."""
    importlib.import_module(module).main(*args, **kwargs)


def set_up(name: str, config: ServingConfig, nice: int = 0) -> None:
    """Called first thing in a child process (``name``: ``inference``, ``http-0``, ...); ``nice`` lowers
    its CPU priority by that much."""
    stop = {signal.SIGTERM, signal.SIGINT}
    for sig in stop:
        signal.signal(sig, signal.SIG_IGN)
    # The supervisor started this process with them blocked; one that came meanwhile is dropped here.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stop)
    prctl = libc_function("prctl", [ctypes.c_int, ctypes.c_ulong], ctypes.c_int)
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        title = ctypes.create_string_buffer(f"mp-{name}".encode()[:15])
        prctl(_PR_SET_NAME, ctypes.addressof(title))
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # the supervisor went before the signal was set
        os._exit(1)
    if nice:
        os.nice(nice)
    logs.set_up(config.log_format, config.log_level, name)


def trace_as(config: ServingConfig) -> None:
    """Start tracing in this process when the worker's configuration names an OTLP endpoint."""
    tracing.setup(SERVICE_NAME, config.otlp_endpoint, config.trace_sample_ratio)


def exit_now(code: int) -> None:
    """Exit now, even if the inference thread is still inside a load or a forward pass (it cannot be
    interrupted, and the interpreter would otherwise join it at exit).  The spans not exported yet go
    first (os._exit runs no atexit hook; nothing happens with tracing off)."""
    tracing.shutdown()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


__all__ = ["SERVICE_NAME", "exit_now", "set_up", "trace_as"]
