"""The task registry: task name -> the class that implements it, imported lazily.

Importing this package is cheap; a task module (and through it torch/transformers/diffusers) is only
imported when ``task_class`` is called, on the worker's load path, after the HTTP server is listening.
``--handler module:Class`` plugs in a user class implementing ``tasks.base.Task`` instead.
"""

from __future__ import annotations

import importlib
from typing import Any

from model_server.tasks.base import Task
from modelpool_contract.tasks import TASK_NAMES, TaskName

# Task name -> "module:Class".
REGISTRY: dict[TaskName, str] = {
    "text-embedding": "model_server.tasks.text_embedding:TextEmbeddingTask",
    "text-generation": "model_server.tasks.text_generation:TextGenerationTask",
    "image-embedding": "model_server.tasks.image_embedding:ImageEmbeddingTask",
    "vision": "model_server.tasks.vision:VisionTask",
    "text-to-image": "model_server.tasks.text_to_image:TextToImageTask",
}
assert set(REGISTRY) == set(TASK_NAMES)


class HandlerError(ImportError):
    """``--handler`` (or a registry entry) cannot be imported or is not a Task class."""


def import_class(spec: str) -> type[Task[Any, Any]]:
    """Import ``module:Class`` and check it implements the Task interface."""
    module_name, _, class_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise HandlerError(f"cannot import module {module_name!r} for {spec!r}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type) or not issubclass(cls, Task):
        raise HandlerError(f"{spec!r} is not a subclass of model_server.tasks.base.Task")
    return cls


def task_class(task: TaskName, handler: str | None = None) -> type[Task[Any, Any]]:
    """The class serving ``task``: the user's ``handler`` when given, else the built-in module."""
    cls = import_class(handler or REGISTRY[task])
    if handler and getattr(cls, "name", task) != task:
        raise HandlerError(f"handler {handler!r} implements task {cls.name!r}, not {task!r}")
    return cls
