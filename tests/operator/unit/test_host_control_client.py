"""The operator's control API client (``effects.host_control.HttpHostControl``) against a real host's
control server (``model_server.supervisor.host_control``, no model loaded): the key it carries, the
host's refusals as ``ControlError`` with the host's status and words, and no answer as status None."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from model_server.host_config import HostConfig
from model_server.supervisor.host import HostSupervisor
from model_server.supervisor.host_control import HostControlServer
from modelpool_operator.effects.host_control import ControlError, HttpHostControl
from testkit.environment import free_port

KEY = "operator-control-key"


@pytest.fixture(scope="module")
def host_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    key_file: Path = tmp_path_factory.mktemp("key") / "key"
    key_file.write_text(KEY)
    config = HostConfig(device_memory="1Gi", max_models=1, control_key_file=key_file)  # type: ignore[arg-type]
    server = HostControlServer(("127.0.0.1", 0), HostSupervisor(config))
    server.serve_in_thread()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
async def control() -> AsyncIterator[HttpHostControl]:
    client = HttpHostControl()
    yield client
    await client.aclose()


async def test_the_client_carries_the_key(host_url: str, control: HttpHostControl) -> None:
    assert await control.index(host_url, KEY) == []
    with pytest.raises(ControlError) as refused:
        await control.index(host_url, "wrong")
    assert refused.value.status == 401 and "key" in str(refused.value)


async def test_the_hosts_refusals_carry_its_status_and_words(host_url: str, control: HttpHostControl) -> None:
    with pytest.raises(ControlError) as unknown:
        await control.unload(host_url, KEY, "nothing")
    assert unknown.value.status == 404
    with pytest.raises(ControlError) as bad:
        await control.load(host_url, KEY, "emb", {"source": "/models/x", "task": "no-such-task"})
    assert bad.value.status == 400 and "parameters.config.task" in str(bad.value)


async def test_no_answer_is_status_none(control: HttpHostControl) -> None:
    with pytest.raises(ControlError) as down:
        await control.sleep(f"http://127.0.0.1:{free_port()}", KEY, "emb")
    assert down.value.status is None
