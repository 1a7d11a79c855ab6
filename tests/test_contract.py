"""Names both halves rely on (DESIGN.md's contract) are spelled the same in the operator and the server.

The operator never imports the model server (it would pull numpy and the task modules into the operator
image), so each keeps its own copy of the task names; this test keeps the copies equal.
"""

from __future__ import annotations

from model_server.tasks import REGISTRY
from model_server.tasks.base import TASK_NAMES as SERVER_TASKS
from modelpool_operator.api import TASK_NAMES as OPERATOR_TASKS


def test_task_names_agree() -> None:
    assert OPERATOR_TASKS == SERVER_TASKS
    assert set(REGISTRY) == set(SERVER_TASKS)
