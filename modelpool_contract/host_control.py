"""A shared host's control API on the wire (Triton's model-repository shape), spelled once for its three
speakers: the host (``model_server.supervisor.host_control``), the operator
(``modelpool_operator.effects.host_control``) and the test kit's simulator and client.

* ``INDEX_PATH`` and ``model_action_path(model, action)``: ``POST /v2/repository/index`` and
  ``POST /v2/repository/models/{model}/{load|unload|sleep|wake}``; ``parse_model_action`` reads a path back.
* ``LoadConfig``: what a load carries (``{"parameters": {"config": "<LoadConfig as JSON>"}}``, ``load_body``):
  the model's source and task, its batching, its queue, its Idle threshold, its declared memory and the
  device the operator chose. ``server_settings`` names each field as the server's own settings do
  (``source`` is ``model``): the one map between the two spellings.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

INDEX_PATH: Final = "/v2/repository/index"
ModelAction = Literal["load", "unload", "sleep", "wake"]
MODEL_ACTIONS: Final[tuple[ModelAction, ...]] = get_args(ModelAction)
_MODEL_ACTION: Final = re.compile(r"^/v2/repository/models/([^/]+)/(" + "|".join(MODEL_ACTIONS) + ")$")


def model_action_path(model: str, action: ModelAction) -> str:
    """``/v2/repository/models/{model}/{action}``."""
    return f"/v2/repository/models/{model}/{action}"


def parse_model_action(path: str) -> tuple[str, ModelAction] | None:
    """The model and the action a control path names (None: not a model action)."""
    match = _MODEL_ACTION.match(path)
    if match is None:
        return None
    action = match.group(2)
    assert action in MODEL_ACTIONS  # the pattern lists them
    return match.group(1), action


#: ``LoadConfig``'s fields whose server setting has another name.
_SERVER_NAMES: Final = {"source": "model"}


class LoadConfig(BaseModel):
    """A load's settings (unset: the host's own for that setting). Unknown fields are refused, naming
    them, so a typo is never silently the host's default; types are strict (a ``"0"`` or ``true`` is not
    a device index, a count or a size): the operator sends JSON numbers."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    source: str = Field(description="The model's source (a path, hf://, pvc://).")
    task: str = Field(description="Its task.")
    handler: str | None = None
    dtype: str | None = None
    max_batch_size: int | None = None
    max_batch_delay_ms: float | None = None
    idle_after: float | None = None
    generation_engine: str | None = None
    kv_cache_tokens: int | None = None
    trust_remote_code: bool | None = None
    runtime: str | None = None
    skip_warmup: bool | None = None
    queue_capacity: int | None = None
    request_timeout: float | None = None
    memory: int | str = Field(default=0, description="Declared bytes (a number or a quantity).")
    device: int | None = Field(default=None, description="The device index (None: the host picks).")

    def server_settings(self) -> dict[str, Any]:
        """The model's settings under the server's names (``ServerConfig`` fields): what was set, less
        ``memory`` and ``device``, which are the host's to act on."""
        fields = self.model_dump(exclude_none=True, exclude={"memory", "device"})
        return {_SERVER_NAMES.get(name, name): value for name, value in fields.items()}

    @staticmethod
    def wire_name(setting: str) -> str:
        """A server setting's name in a load config (for an error that names the field)."""
        return {server: wire for wire, server in _SERVER_NAMES.items()}.get(setting, setting)


def load_body(config: LoadConfig) -> dict[str, Any]:
    """The load call's body: Triton's repository shape, the settings as a JSON string."""
    settings = config.model_dump(exclude_none=True)
    return {"parameters": {"config": json.dumps(settings, sort_keys=True)}}


__all__ = [
    "INDEX_PATH",
    "MODEL_ACTIONS",
    "LoadConfig",
    "ModelAction",
    "load_body",
    "model_action_path",
    "parse_model_action",
]
