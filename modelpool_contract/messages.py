"""The one bound on a human-readable message the operator writes into the API: Events and status.

The API server refuses an Event whose message passes 1024 bytes (its check counts bytes, not characters),
and a refused Event is lost with only a warning in the log; status messages carry the same bound so that
a pool's conditions and workers read the same as its Events.  Every writer fits its message here (the
status types validate through ``Message``), so no producer cuts its own.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import AfterValidator

#: The API server's limit on an Event's message, in bytes of UTF-8.
MESSAGE_BYTES: Final = 1024
_CUT: Final = "…"


def fit_message(message: str, limit: int = MESSAGE_BYTES) -> str:
    """``message`` cut to at most ``limit`` bytes of UTF-8 (ending with an ellipsis when cut), never in
    the middle of a character."""
    data = message.encode()
    if len(data) <= limit:
        return message
    return data[: limit - len(_CUT.encode())].decode(errors="ignore") + _CUT


#: A status message: fitted on validation, whoever built it.
Message = Annotated[str, AfterValidator(fit_message)]
