"""One API request of a pass, attempted: its failure as a value (``ApiFailure``), never raised, so that a
pass goes on past it and reports it (the pool's or ModelHost's ApiError condition, a Warning Event).
Its own module, as both the effects and the bookkeeping (which remembers a failure) name it."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass

from modelpool_operator.effects.kube import InferencePoolUnavailableError, NameTakenError, describe_error

#: The reason (ApiError condition, Warning Event) when an object of the name the operator would make is
#: someone else's: it is left as it is (``NameTakenError``), never patched.
NAME_TAKEN = "NameTaken"
#: The reason when a pool asks for an InferencePool and the cluster has no InferencePool API.
INFERENCE_POOL_UNAVAILABLE = "InferencePoolUnavailable"


@dataclass(frozen=True)
class ApiFailure:
    """One API request of a pass that failed: ``reason`` names what failed (the condition's reason and the
    Event's), ``message`` says which object and the API server's own words."""

    reason: str
    message: str


async def attempt(reason: str, what: str, request: Awaitable[object]) -> ApiFailure | None:
    """Await one effect of the pass; its failure as an ``ApiFailure`` (never raised: the pass goes on)."""
    try:
        await request
    except NameTakenError as exc:  # not an API failure: our name is someone else's object
        return ApiFailure(NAME_TAKEN, str(exc))
    except InferencePoolUnavailableError as exc:  # not the request's fault: the cluster lacks the API
        return ApiFailure(INFERENCE_POOL_UNAVAILABLE, f"{what}: {exc}")
    except Exception as exc:  # whatever failed, the other effects and the status still happen
        return ApiFailure(reason, f"{what}: {describe_error(exc)}")
    return None


__all__ = ["INFERENCE_POOL_UNAVAILABLE", "NAME_TAKEN", "ApiFailure", "attempt"]
