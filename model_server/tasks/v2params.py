"""Typed reading of KServe v2 request ``parameters`` (sampling and diffusion settings), with a 400-worthy
reason for every wrong type or out-of-range value.  Pure functions, no torch."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from model_server.errors import InvalidInput
from model_server.tasks.base import GenerationParams

# Upper bound on new tokens per request whatever the model's context (bounds the time one request holds
# the single inference thread).
MAX_NEW_TOKENS = 4096
MAX_STOP_SEQUENCES = 4


def get_int(parameters: Mapping[str, Any], name: str, default: int, *, lo: int, hi: int) -> int:
    """An integer parameter in ``[lo, hi]``; numeric strings are accepted (some clients send strings)."""
    value = parameters.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidInput(f"parameter '{name}' must be an integer, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise InvalidInput(f"parameter '{name}' must be an integer, got {value!r}") from None
    if not number.is_integer():
        raise InvalidInput(f"parameter '{name}' must be an integer, got {value!r}")
    result = int(number)
    if not lo <= result <= hi:
        raise InvalidInput(f"parameter '{name}' must be between {lo} and {hi}, got {result}")
    return result


def get_float(parameters: Mapping[str, Any], name: str, default: float, *, lo: float, hi: float) -> float:
    """A finite float parameter in ``[lo, hi]``."""
    value = parameters.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidInput(f"parameter '{name}' must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise InvalidInput(f"parameter '{name}' must be a number, got {value!r}") from None
    if not math.isfinite(number) or not lo <= number <= hi:
        raise InvalidInput(f"parameter '{name}' must be between {lo} and {hi}, got {value!r}")
    return number


def get_optional_int(parameters: Mapping[str, Any], name: str, *, lo: int, hi: int) -> int | None:
    """Like ``get_int`` but ``None`` when absent (e.g. ``seed``)."""
    if parameters.get(name) is None:
        return None
    return get_int(parameters, name, 0, lo=lo, hi=hi)


def get_stop(parameters: Mapping[str, Any], name: str = "stop") -> tuple[str, ...]:
    """Stop sequences: a string, a list of strings, or a JSON-encoded list (v2 parameters are scalars)."""
    value = parameters.get(name)
    if value is None:
        return ()
    if isinstance(value, str) and value.startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"parameter '{name}' is not a valid JSON list of strings: {exc}") from None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise InvalidInput(f"parameter '{name}' must be a string or a list of strings")
    return validate_stop(tuple(stops))


def validate_stop(stops: tuple[str, ...]) -> tuple[str, ...]:
    """At most ``MAX_STOP_SEQUENCES`` non-empty stop strings (OpenAI's limit)."""
    if len(stops) > MAX_STOP_SEQUENCES:
        raise InvalidInput(f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed, got {len(stops)}")
    if any(not s for s in stops):
        raise InvalidInput("stop sequences must not be empty strings")
    return stops


def generation_params(parameters: Mapping[str, Any]) -> GenerationParams:
    """``max_tokens``, ``temperature``, ``top_p``, ``stop``, ``seed`` from v2 parameters."""
    defaults = GenerationParams()
    return GenerationParams(
        max_tokens=get_int(parameters, "max_tokens", defaults.max_tokens, lo=1, hi=MAX_NEW_TOKENS),
        temperature=get_float(parameters, "temperature", defaults.temperature, lo=0.0, hi=2.0),
        top_p=get_float(parameters, "top_p", defaults.top_p, lo=0.0, hi=1.0),
        stop=get_stop(parameters),
        seed=get_optional_int(parameters, "seed", lo=0, hi=2**63 - 1),
    )


def check_generation_params(params: GenerationParams) -> None:
    """Range checks for params built by any route (the OpenAI routes build them from JSON)."""
    if not 1 <= params.max_tokens <= MAX_NEW_TOKENS:
        raise InvalidInput(f"max_tokens must be between 1 and {MAX_NEW_TOKENS}, got {params.max_tokens}")
    if not (math.isfinite(params.temperature) and 0.0 <= params.temperature <= 2.0):
        raise InvalidInput(f"temperature must be between 0 and 2, got {params.temperature}")
    if not (math.isfinite(params.top_p) and 0.0 < params.top_p <= 1.0):
        raise InvalidInput(f"top_p must be in (0, 1], got {params.top_p}")
    if params.seed is not None and not 0 <= params.seed < 2**63:
        raise InvalidInput(f"seed must be between 0 and 2**63-1, got {params.seed}")
    validate_stop(params.stop)
