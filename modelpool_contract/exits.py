"""The server's exit codes, as the operator reads them from a terminated worker container, and how long
a worker may take to end (the pod's grace period is computed from the same numbers).

0 is a clean exit (drained after SIGTERM); the reason of a failure is in the termination message.
"""

from __future__ import annotations

import math
from typing import Final

#: Invalid flags or environment (the one-line reason is printed on stderr).
EXIT_CONFIG: Final = 2
#: The model failed to load (the operator reports the worker Failed with reason LoadFailed).
EXIT_LOAD_FAILED: Final = 3
#: A device error left the accelerator unusable (e.g. an illegal memory access); the process must go.
EXIT_DEVICE_FAILED: Final = 4
#: A process of the worker (the inference process or an HTTP process) died; the others were stopped.
EXIT_PROCESS_DIED: Final = 5
#: SIGTERM's drain did not finish within ``--drain-timeout``: the requests still held were answered 503
#: ("drain timed out after 30 s: 3 requests abandoned" in the termination message).
EXIT_DRAIN_TIMED_OUT: Final = 6
#: A forward pass ran past ``--request-timeout`` + ``--wedge-grace`` (stuck in a kernel, a deadlock):
#: the worker is Failed and its processes stopped, so that its memory is released.
EXIT_INFERENCE_WEDGED: Final = 7

# ---- how long the supervisor may take to end, at worst, after SIGTERM --------------------------------

#: After ``--drain-timeout``, how much longer the inference process gets to exit (it answers what is
#: left, flushes its answers for at most ``INFERENCE_FLUSH_S``) before the supervisor stops it.
DRAIN_GRACE_S: Final = 10.0
#: How long the inference process's answers may take to reach the HTTP processes at its exit.
INFERENCE_FLUSH_S: Final = 2.0
#: How long the processes told to stop get (the HTTP processes finish the answers in progress).
STOP_TIMEOUT_S: Final = 10.0
#: How long the processes still running after that get to die of SIGKILL, all together.
KILL_TIMEOUT_S: Final = 5.0
#: The supervisor's own exit after its processes are gone (the termination log, the interpreter).
EXIT_SLACK_S: Final = 5.0


def worst_case_shutdown_s(drain_timeout: float) -> float:
    """Pure: the longest a worker takes from SIGTERM to its exit, with ``--drain-timeout`` given (the
    pod's ``terminationGracePeriodSeconds`` must be at least this, or the kubelet's SIGKILL cuts the drain
    short and the exit code and termination message are lost)."""
    return drain_timeout + DRAIN_GRACE_S + STOP_TIMEOUT_S + KILL_TIMEOUT_S + EXIT_SLACK_S


def termination_grace_period_s(drain_timeout: float) -> int:
    """Pure: the pod's ``terminationGracePeriodSeconds`` (whole seconds) for ``--drain-timeout``."""
    return math.ceil(worst_case_shutdown_s(drain_timeout))
