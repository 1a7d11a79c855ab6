"""The task names: what a ModelPool's ``spec.model.task`` may say and the server's ``--task`` accepts."""

from __future__ import annotations

from typing import Final, Literal, get_args

TaskName = Literal["text-embedding", "text-generation", "image-embedding", "vision", "text-to-image"]
TASK_NAMES: Final[tuple[TaskName, ...]] = get_args(TaskName)
