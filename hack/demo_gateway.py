"""`make demo`'s traffic through ``modelpool-gateway`` (hack/demo.sh): the real ``openai`` client wakes a
pool; closed-loop clients scale one.

    DEMO_API_KEY=KEY python -m hack.demo_gateway wake  --gateway URL --kubeconfig K --namespace NS \
        --pool minilm --timeout S
    DEMO_API_KEY=KEY python -m hack.demo_gateway scale --gateway URL --kubeconfig K --namespace NS \
        --pool echo --clients 12 --max-replicas 3 --timeout S

The gateway's API key comes from ``$DEMO_API_KEY`` (not a flag: a process's arguments are visible to
every user of the machine); both send it as ``Authorization: Bearer``.

``wake``: one request for a pool at zero; prints the time from the request to its first answer and where
it went (``bench.wake``).  ``scale``: ``--clients`` closed-loop clients (``testkit.load.ClosedLoop``,
each one request outstanding) through the gateway until the pool has ``--max-replicas`` Ready workers,
then none until it is back to one worker; every change of the pool's DESIRED count, readiness, observed
load and workers is printed as it happens.  Every wait is bounded by ``--timeout``; a miss exits 1 with
what was awaited.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from bench.wake import wake
from testkit.kubectl import kubectl
from testkit.load import ClosedLoop


def spread(load: ClosedLoop, workers: int, timeout: float) -> None:
    """Until ``workers`` workers have answered; SystemExit at the deadline."""
    deadline = time.monotonic() + timeout
    while len(load.workers) < workers:
        if time.monotonic() > deadline:
            raise SystemExit(f"the gateway's answers came from {dict(load.workers)}, not {workers} workers")
        time.sleep(0.2)


@dataclass
class PoolView:
    """Prints one line of the pool's status at each change: DESIRED, READY, observed load, workers."""

    kubeconfig: Path
    namespace: str
    pool: str
    timeout: float
    started: float = field(default_factory=time.monotonic)

    def row(self) -> tuple[dict[str, Any], str]:
        got = kubectl(self.kubeconfig, "get", "modelpools", self.pool, "-n", self.namespace, "-o", "json")
        status: dict[str, Any] = json.loads(got)["status"]
        workers = " ".join(f"{w['name']}={w['state']}" for w in status.get("workers") or [])
        load = (status.get("autoscaling") or {}).get("observedLoad")
        load_text = "-" if load is None else str(load)
        desired, ready = status.get("targetReplicas", 0), status.get("readyReplicas", 0)
        return status, f"{desired:<8} {ready:<6} {load_text:<5} {workers}"

    def until(self, done: Callable[[dict[str, Any]], bool], what: str) -> None:
        """Print each change until ``done(status)``; SystemExit naming ``what`` at the deadline."""
        deadline = time.monotonic() + self.timeout
        last = ""
        while True:
            status, row = self.row()
            if row != last:
                print(f"    {time.monotonic() - self.started:<7.1f} {row}", flush=True)
                last = row
            if done(status):
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"pool {self.namespace}/{self.pool}: not {what} within {self.timeout:.0f}s")
            time.sleep(0.5)


def scale(args: argparse.Namespace) -> None:
    view = PoolView(args.kubeconfig, args.namespace, args.pool, args.timeout)
    top = args.max_replicas
    print(f"    {'T+s':<7} {'DESIRED':<8} {'READY':<6} {'LOAD':<5} WORKERS (state)")
    print(f"    -- {args.clients} clients through the gateway, one request outstanding each", flush=True)
    headers = {"Authorization": f"Bearer {args.api_key}"}
    load = ClosedLoop(lambda _: args.gateway, args.pool, args.clients, headers=headers).start()
    try:
        view.until(lambda s: s.get("readyReplicas") == top, f"scaled up to {top} Ready workers")
        # The new workers join as soon as the operator marks them serving and the gateway's watch sees it.
        spread(load, top, args.timeout)
    finally:
        load.stop()
    print(f"    -- load stopped: answers {dict(load.codes)}, by worker {dict(load.workers)}", flush=True)
    if set(load.codes) != {200} or load.errors:
        raise SystemExit(
            f"requests through the gateway were not all answered 200: {dict(load.codes)} {load.errors[:3]}"
        )
    view.until(
        lambda s: s.get("targetReplicas") == 1 and len(s.get("workers") or []) == 1, "back to one worker"
    )


def wake_command(args: argparse.Namespace) -> None:
    model = args.pool
    print(
        f"    openai.OpenAI(base_url='{args.gateway}/v1', api_key=KEY)"
        f".embeddings.create(model='{model}', ...)",
        flush=True,
    )
    try:
        woke = wake(
            args.gateway, args.kubeconfig, args.namespace, model, timeout=args.timeout, api_key=args.api_key
        )
    except openai.APIStatusError as exc:  # the gateway's answer says why (loading, budget, ...)
        raise SystemExit(f"the gateway answered {exc.status_code}: {exc.message}") from exc
    except openai.APITimeoutError as exc:
        raise SystemExit(f"no answer from the gateway within {args.timeout:.0f}s") from exc
    print(f"    first answer after {woke.seconds:.1f}s (worker {woke.worker}, {woke.dimensions} dimensions)")
    print(f"    on the way: {woke.describe()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("command", choices=["wake", "scale"])
    parser.add_argument("--gateway", required=True, help="the gateway's base URL, http://host:port")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--pool", required=True)
    parser.add_argument("--timeout", type=float, default=240, help="bound of every wait (seconds)")
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--max-replicas", type=int, default=3)
    args = parser.parse_args(argv)
    args.api_key = os.environ.get("DEMO_API_KEY", "")
    if not args.api_key:
        parser.error("set DEMO_API_KEY to the gateway's API key")
    (scale if args.command == "scale" else wake_command)(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
