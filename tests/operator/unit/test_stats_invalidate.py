"""``StatsScraper.invalidate``: after a control call changed a host pod, its cached ``/stats`` (fresher than
the interval, but older than the change) is refetched at the next refresh, its arrival pokes the pass even
with no news, and a fetch begun before the change does not count as the new one."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from modelpool_operator.observe.stats import StatsScraper

POD = {
    "metadata": {"name": "gpus-0", "uid": "u", "resourceVersion": "1"},
    "spec": {"containers": [{"ports": [{"name": "probes", "containerPort": 8001}]}]},
    "status": {"phase": "Running", "podIP": "10.0.0.1"},
}


def test_an_invalidated_pod_is_refetched_at_once_and_its_answer_pokes_the_pass() -> None:
    answered: list[int] = []
    gate = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        answered.append(len(answered))
        if len(answered) == 3:
            await gate.wait()  # the third fetch is slow: it began before the change below
        return httpx.Response(200, json={"host": {"devices": []}, "models": {}})

    async def run() -> dict[str, Any]:
        client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        scraper = StatsScraper(
            interval=60, timeout=1, concurrency=4, backoff_cap=30, default_port=8001, client=client
        )
        pokes: list[int] = []
        poke = lambda: pokes.append(1)  # noqa: E731

        async def settle() -> None:
            for _ in range(20):
                await asyncio.sleep(0)

        await scraper.scrape([POD])
        scraper.refresh([POD], on_change=poke)
        await settle()
        fresh_kept = (len(answered), len(pokes))  # fresh: not fetched again, nothing new
        scraper.invalidate(POD)
        pending = scraper.pending(POD)
        scraper.refresh([POD], on_change=poke)
        await settle()
        after = (len(answered), len(pokes), scraper.pending(POD))  # refetched, and poked with no news
        # A fetch begun before a change leaves the pod stale: the next refresh asks again.
        scraper.invalidate(POD)
        scraper.refresh([POD], on_change=poke)
        await settle()
        scraper.invalidate(POD)  # the change lands while the third fetch is in flight
        gate.set()
        await settle()
        still_pending = scraper.pending(POD)
        scraper.refresh([POD], on_change=poke)
        await settle()
        await scraper.aclose()
        return {
            "fresh_kept": fresh_kept,
            "pending": pending,
            "after": after,
            "still_pending": still_pending,
            "end": (len(answered), scraper.pending(POD)),
        }

    result = asyncio.run(run())
    assert result["fresh_kept"] == (1, 0)
    assert result["pending"] is True
    assert result["after"] == (2, 1, False)
    assert result["still_pending"] is True
    assert result["end"] == (4, False)
