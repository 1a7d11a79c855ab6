"""One real shared host serving models of four tasks at once (issue 21's process check): all-MiniLM-L6-v2
and tiny models of text-generation, image-embedding and vision (``testkit.tiny_models``), each asked
through the real ``openai`` client by its name. Observed end to end on the host's control API: a load
that needs room puts the least recently used idle model to sleep, a request wakes it and is answered,
an unload frees its name, and a model whose process is killed fails alone while the others serve on.

The ledger is the declared memory (a CPU host measures no device memory): 1000 MiB, 10 MiB of process
overhead per model, so three models fit awake and the fourth's load must make room.
"""

from __future__ import annotations

import base64
import os
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from testkit.server import ServerProcess, SharedHost, start_host
from testkit.waiting import wait_for
from tests.server.tiny_fixtures import image_bytes, tiny_image_embedding, tiny_text_generation, tiny_vision

__all__ = ["tiny_image_embedding", "tiny_text_generation", "tiny_vision"]  # fixtures used by name

pytestmark = pytest.mark.slow

MI = 1 << 20
WAIT_S = 60.0


class Host(SharedHost):
    """The host, its control API and an ``openai`` client on its serving port."""

    def __init__(self, server: ServerProcess) -> None:
        super().__init__(server)
        self.client = openai.OpenAI(
            base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=WAIT_S
        )

    def free(self) -> int:
        return int(self.stats()["host"]["devices"][0]["free"])


def ask(host: Host, name: str) -> None:
    """One small request of the model's task, answered (or the client raises)."""
    client, image = host.client, base64.b64encode(image_bytes((200, 30, 30), (32, 32))).decode()
    if name == "minilm":
        assert (
            len(client.embeddings.create(model=name, input="A man is eating food.").data[0].embedding) == 384
        )
    elif name == "img":
        assert len(client.embeddings.create(model=name, input=[image]).data[0].embedding) == 16
    elif name == "gen":
        assert client.completions.create(model=name, prompt="Once upon a time", max_tokens=4).choices
    else:
        content: Any = [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + image}},
        ]
        answer = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": content}], max_tokens=4
        )
        assert answer.choices[0].message.content is not None


def until(condition: Callable[[], bool], what: str) -> None:
    wait_for(condition, WAIT_S, 0.05, what)


@pytest.fixture(scope="module")
def host(
    minilm: Path, tiny_text_generation: Path, tiny_image_embedding: Path, tiny_vision: Path
) -> Iterator[tuple[Host, dict[str, dict[str, Any]]]]:
    host = Host(start_host(device_memory=1000 * MI, max_models=4, model_overhead=10 * MI))
    loads = {
        "minilm": {"source": str(minilm), "task": "text-embedding", "memory": f"{300 * MI}"},
        "gen": {"source": str(tiny_text_generation), "task": "text-generation", "memory": f"{300 * MI}"},
        "img": {"source": str(tiny_image_embedding), "task": "image-embedding", "memory": f"{300 * MI}"},
        "vision": {"source": str(tiny_vision), "task": "vision", "memory": f"{300 * MI}"},
    }
    try:
        yield host, loads
    finally:
        host.stop()


def test_four_tasks_share_one_host_sleep_wake_make_room_unload_and_fail_alone(
    host: tuple[Host, dict[str, dict[str, Any]]],
) -> None:
    h, loads = host
    first = ("minilm", "gen", "img")
    with ThreadPoolExecutor(len(first)) as pool:  # the loads run side by side
        answers = dict(zip(first, pool.map(lambda n: h.call(n, "load", loads[n]), first), strict=True))
    for name, answer in answers.items():
        assert answer.status_code == 200 and answer.json()["state"] == "Ready", (name, answer.text)
    for name in ("gen", "minilm", "img"):  # gen is now the least recently used
        ask(h, name)

    # 3 x 300 MiB + 3 x 10 MiB awake: vision's 300 + 10 do not fit in 1000 until gen sleeps.
    loaded = h.call("vision", "load", loads["vision"])
    assert loaded.status_code == 200 and loaded.json()["state"] == "Ready", loaded.text
    assert h.states() == {"minilm": "Ready", "gen": "Sleeping", "img": "Ready", "vision": "Ready"}
    assert h.free() >= 0
    ask(h, "vision")

    # A request for the sleeping model wakes it (another idle model sleeps for it) and is answered.
    ask(h, "gen")
    states = h.states()
    assert states["gen"] in ("Ready", "Processing") and list(states.values()).count("Sleeping") == 1, states
    assert h.free() >= 0

    # Unloaded, a model's name is free: a request for it is 404, the others answer.
    asleep = next(name for name, state in states.items() if state == "Sleeping")
    assert h.call(asleep, "unload").status_code == 200
    assert asleep not in h.index()
    with pytest.raises(openai.NotFoundError):
        ask(h, asleep)

    # A model whose process dies fails alone; the others serve on.
    victim, *others = [name for name in ("vision", "gen", "img", "minilm") if name != asleep]
    os.kill(h.index()[victim]["pid"], signal.SIGKILL)
    until(lambda: h.states()[victim] == "Failed", f"{victim} Failed")
    for name in others:
        ask(h, name)
