"""Typed domain errors of the model server, and the one place they are mapped to HTTP status codes.

Every layer raises these; only ``endpoints`` turns them into responses
(``endpoints.common.http_response``), so the same reason reaches the client, the logs and the metrics'
``reason`` label.
"""

from __future__ import annotations

from typing import Any


class ServerError(Exception):
    """Base class: ``status`` is the HTTP code, ``reason`` the metrics label, str(exc) the message.

    ``retry_after_s``, when set, becomes the response's ``Retry-After`` header: the error is temporary
    and a client (or a retrying proxy) should come back after that many seconds.
    """

    status: int = 500
    reason: str = "error"
    retry_after_s: int | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross the process boundary (pickled with the answer): rebuild the same class with the
        # same message and Retry-After, whatever its constructor takes.
        return _rebuild, (type(self), str(self), self.retry_after_s)


def _rebuild(cls: type[ServerError], message: str, retry_after_s: int | None) -> ServerError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.retry_after_s = retry_after_s
    return error


class InvalidInput(ServerError):  # noqa: N818 - KServe-style names
    """The request is malformed or does not fit the model (wrong tensor, empty input, bad UTF-8...)."""

    status = 400
    reason = "invalid_input"


class ModelNotFound(ServerError):  # noqa: N818 - KServe-style names
    """The request names a model this server does not serve."""

    status = 404
    reason = "model_not_found"


class UnsupportedOperation(ServerError):  # noqa: N818 - KServe-style names
    """The route exists but not for this model's task (e.g. /v1/embeddings on a text-to-image model)."""

    status = 400
    reason = "unsupported"


class SleepRefused(ServerError):  # noqa: N818 - KServe-style names
    """The model cannot sleep (or wake) now: not loaded, not Ready or Idle, work in hand, already asleep,
    or its weights could not be parked (host memory short: they are back and the model serves on)."""

    status = 409
    reason = "sleep_refused"


class PayloadTooLarge(ServerError):  # noqa: N818 - KServe-style names
    """The body exceeds ``--max-request-bytes`` (or the item count exceeds the batch limit)."""

    status = 413
    reason = "too_large"


class BodyTimeout(ServerError):  # noqa: N818 - KServe-style names
    """The request body did not arrive within ``--request-body-timeout-seconds``."""

    status = 408
    reason = "body_timeout"


class Overloaded(ServerError):  # noqa: N818 - KServe-style names
    """The bounded queue is full: 429 with Retry-After."""

    status = 429
    reason = "overloaded"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, retry_after_s)


class ModelNotReady(ServerError):  # noqa: N818 - KServe-style names
    """Loading, Evicting (draining), Failed: 503.

    Retry-After is a short, fixed hint: a loading model is usually seconds away, and behind a Service a
    retry reaches another worker anyway.
    """

    status = 503
    reason = "not_ready"
    retry_after_s = 2


class DeadlineExceeded(ServerError):  # noqa: N818 - KServe-style names
    """The request's deadline passed before (or while) it was computed: 504."""

    status = 504
    reason = "timeout"


class InferenceError(ServerError):
    """The forward pass raised: this unit of work fails with 500, the worker goes on serving."""

    status = 500
    reason = "inference_error"


class FatalDeviceError(ServerError):
    """An unrecoverable device error (illegal memory access, device-side assert): the worker is Failed."""

    status = 500
    reason = "device_error"


# Substrings of CUDA errors after which the context is unusable (the process must be restarted).
_FATAL_MARKERS = (
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "cuda error: misaligned address",
    "an illegal instruction was encountered",
    "cublas_status_execution_failed",
    "uncorrectable ecc error",
    "cuda driver error",
)


def is_oom(exc: BaseException) -> bool:
    """Pure: is this a (recoverable) device out-of-memory error?"""
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()


def is_fatal_device_error(exc: BaseException) -> bool:
    """Pure: does this error leave the device unusable?"""
    if isinstance(exc, FatalDeviceError):
        return True
    text = str(exc).lower()
    return any(marker in text for marker in _FATAL_MARKERS)
