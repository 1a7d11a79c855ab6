"""The server's exit codes, as the operator reads them from a terminated worker container.

0 is a clean exit (drained after SIGTERM); the reason of a failure is in the termination message.
"""

from __future__ import annotations

from typing import Final

#: Invalid flags or environment (the one-line reason is printed on stderr).
EXIT_CONFIG: Final = 2
#: The model failed to load (the operator reports the worker Failed with reason LoadFailed).
EXIT_LOAD_FAILED: Final = 3
#: A device error left the accelerator unusable (e.g. an illegal memory access); the process must go.
EXIT_DEVICE_FAILED: Final = 4
#: A process of the worker (the inference process or an HTTP process) died; the others were stopped.
EXIT_PROCESS_DIED: Final = 5
