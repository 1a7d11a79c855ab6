"""The soak's clients: polite and rude, through the gateway, every request recorded.

* polite: one request at a time; a 429 or 503 is retried after its ``Retry-After`` (1 s when absent);
* rude: one request at a time, resent at once whatever the answer; every third hangs up mid-request (a
  client timeout far below the answer time), which the gateway must survive.

Each request is a ``Sent`` record: when it left, when it ended, its status code or the error, and the
deadline the client gave it.  The auditor judges every record (``Auditor.judge_request``) as it ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

DEADLINE_S = 30.0
HANG_UP_S = 0.05


@dataclass
class Sent:
    """One request: monotonic start and end, the answer's status (None: none came) or the error."""

    client: str
    pool: str
    start: float
    deadline: float
    end: float = 0.0
    status: int | None = None
    error: str = ""
    hung_up: bool = False
    retry_after: str | None = None


@dataclass
class Clients:
    """``polite`` + ``rude`` client threads sending embeddings requests for ``pools`` (round robin) to
    ``target()`` (the current gateway; None while there is none).  ``judge`` sees every ended request."""

    target: Callable[[], str | None]
    pools: Callable[[], list[str]]
    headers: dict[str, str]
    judge: Callable[[Sent], None]
    polite: int = 2
    rude: int = 2
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    in_flight: dict[int, Sent] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Clients:
        for i in range(self.polite):
            self._threads.append(threading.Thread(target=self._run, args=(f"polite-{i}", False), daemon=True))
        for i in range(self.rude):
            self._threads.append(threading.Thread(target=self._run, args=(f"rude-{i}", True), daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> list[Sent]:
        """Stop sending; wait for the requests in flight (each ends within its deadline); returns those
        that did not end (the auditor counts them as unanswered)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(DEADLINE_S + 10)
        with self._lock:
            return list(self.in_flight.values())

    def _run(self, name: str, rude: bool) -> None:
        count = 0
        with httpx.Client(trust_env=False, headers=self.headers) as http:
            while not self._stop.is_set():
                url, pools = self.target(), self.pools()
                if url is None or not pools:
                    self._stop.wait(0.1)
                    continue
                count += 1
                hang_up = rude and count % 3 == 0
                sent = Sent(name, pools[count % len(pools)], time.monotonic(), DEADLINE_S)
                self._send(http, url, sent, hang_up)
                self.judge(sent)
                self._pause(sent, rude)

    def _send(self, http: httpx.Client, url: str, sent: Sent, hang_up: bool) -> None:
        body = {"model": sent.pool, "input": [f"{sent.client} asks about a man eating food"]}
        key = id(sent)
        with self._lock:
            self.in_flight[key] = sent
        try:
            timeout = httpx.Timeout(HANG_UP_S if hang_up else sent.deadline, connect=5.0)
            response = http.post(url + "/v1/embeddings", json=body, timeout=timeout)
            sent.status = response.status_code
            sent.retry_after = response.headers.get("retry-after")
        except httpx.TimeoutException as exc:
            sent.hung_up = hang_up
            sent.error = "" if hang_up else f"{type(exc).__name__}: no answer within {sent.deadline:.0f}s"
        except httpx.HTTPError as exc:
            sent.error = f"{type(exc).__name__}: {exc}"
        finally:
            sent.end = time.monotonic()
            with self._lock:
                self.in_flight.pop(key, None)

    def _pause(self, sent: Sent, rude: bool) -> None:
        if rude:
            if sent.error:
                self._stop.wait(0.05)  # nothing listening: do not spin
            return
        if sent.status in (429, 503):
            retry_after = sent.retry_after
            self._stop.wait(float(retry_after) if retry_after and retry_after.isdigit() else 1.0)
        elif sent.error:
            self._stop.wait(0.5)
        else:
            self._stop.wait(0.05)
