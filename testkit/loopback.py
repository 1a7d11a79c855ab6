"""Every pod IP the local cluster assigns must lie in 127.0.0.0/8: a guard that fails the run otherwise.

Tests, the demo and the benchmarks send traffic to pod IPs (the operator scrapes `/stats` on every
worker's pod IP).  On the machines this project runs on, a test may reach loopback addresses only, so
KWOK's fake nodes hand out pod IPs inside 127.0.0.0/8 (hack/kwok/nodes.yaml) and the process node gives
its pods 127.<octet>.y.z.  A pod CIDR that slips back to a private range would make every scrape leave
the machine silently; this guard makes it loud.  It lists and then watches pods in all namespaces for the
whole run, remembers every address any pod was ever given (pods of deleted namespaces included), and
names each pod whose address lies outside 127.0.0.0/8.

In process (the pytest session fixture, ``bench.controlplane``)::

    guard = PodIPWatch(kubeconfig); guard.start(); ...; guard.stop(); guard.raise_for_violations()

From a shell (``hack/demo.sh``)::

    python -m testkit.loopback watch --kubeconfig K --record FILE &   # until SIGTERM
    python -m testkit.loopback check FILE                             # exit 1 naming the pods
"""

from __future__ import annotations

import argparse
import ipaddress
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from testkit.watch import ListWatch, Obj

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
READY_LINE = "# listed"  # written to a record file once the initial list is in: the watch is live
WATCH_SECONDS = 5  # each watch call ends after this, so stop() takes effect within it


# ---- the decision (pure) ---------------------------------------------------------------------------------
def is_loopback(ip: str) -> bool:
    """True for an IPv4 address in 127.0.0.0/8; anything else, an unparsable string included, is not."""
    try:
        return ipaddress.ip_address(ip) in LOOPBACK
    except ValueError:
        return False


def pod_addresses(status: Mapping[str, Any] | None) -> set[str]:
    """The addresses a pod status carries (`podIP` and every `podIPs[].ip`)."""
    status = status or {}
    found = {str(status["podIP"])} if status.get("podIP") else set()
    found |= {str(entry["ip"]) for entry in status.get("podIPs") or [] if entry.get("ip")}
    return found


def violations(seen: Mapping[str, Iterable[str]]) -> list[str]:
    """One line per pod address outside 127.0.0.0/8, as ``namespace/name: ip``, sorted."""
    return sorted(f"{pod}: {ip}" for pod, ips in seen.items() for ip in ips if not is_loopback(ip))


def summary(seen: Mapping[str, Iterable[str]]) -> str:
    addresses = sum(len(set(ips)) for ips in seen.values())
    return f"pod IP guard: {len(seen)} pods, {addresses} addresses, all inside 127.0.0.0/8"


def violation_report(bad: list[str]) -> str:
    return (
        f"{len(bad)} pod address(es) outside 127.0.0.0/8 were assigned in the local cluster; tests, the "
        "demo and the benchmarks may send traffic only to loopback (give every node a pod CIDR inside "
        "127.0.0.0/8):\n  " + "\n  ".join(bad)
    )


# ---- the record ------------------------------------------------------------------------------------------
class PodIPRecord:
    """Every (pod, address) pair seen, thread-safe, optionally appended to a file as ``ns/name ip`` lines."""

    def __init__(self, sink: TextIO | None = None) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, set[str]] = {}
        self._sink = sink

    def add(self, pod: str, ips: Iterable[str]) -> None:
        with self._lock:
            known = self._seen.setdefault(pod, set())
            for ip in sorted(set(ips) - known):
                known.add(ip)
                if self._sink is not None:
                    self._sink.write(f"{pod} {ip}\n")
                    self._sink.flush()

    def snapshot(self) -> dict[str, set[str]]:
        with self._lock:
            return {pod: set(ips) for pod, ips in self._seen.items()}


def read_record(path: Path) -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        pod, _, ip = line.partition(" ")
        seen.setdefault(pod, set()).add(ip.strip())
    return seen


# ---- the watch (thin wiring over testkit.watch) ------------------------------------------------------------
class PodIPWatch:
    """Lists, then watches, pods in all namespaces (``testkit.watch.ListWatch``, retrying) and records
    their addresses.

    A watch that expires (410 Gone) or fails is followed by a fresh list, with a bounded back-off while
    the API server is away, so the record misses nothing that exists at any list and every change between.
    """

    def __init__(
        self,
        kubeconfig: Path,
        record: PodIPRecord | None = None,
        *,
        on_list: Callable[[list[Obj]], None] | None = None,
        on_event: Callable[[str, Obj], None] | None = None,
    ) -> None:
        """``on_list``/``on_event``: also hand every list and event, once recorded, to another watcher
        (the soak's auditor reads the same pods without a second watch)."""
        self.record = record or PodIPRecord()
        self._then_list, self._then_event = on_list, on_event
        self._watch = ListWatch(
            kubeconfig,
            "CoreV1Api",
            "list_pod_for_all_namespaces",
            on_event=self._event,
            on_list=self._list,
            retry=True,
            watch_seconds=WATCH_SECONDS,
            name="pod-ip-guard",
        )

    def start(self, timeout: float = 60) -> None:
        """Start watching; returns once the first list is recorded (raises if it is not within timeout)."""
        try:
            self._watch.start(timeout)
        except TimeoutError:
            raise TimeoutError(
                f"pod IP guard: no pod list from the API server within {timeout:.0f}s"
            ) from None

    def stop(self) -> None:
        """Stop the watch after one last list, so pods created just before the stop are recorded too."""
        self._watch.stop(timeout=WATCH_SECONDS * 3)
        try:
            self._watch.list_now()
        except Exception as exc:  # the cluster may already be gone; what was recorded still counts
            sys.stderr.write(f"pod IP guard: final list failed ({exc}); checking what was recorded\n")

    def raise_for_violations(self) -> str:
        """Raise naming every pod outside 127.0.0.0/8; otherwise return a one-line summary."""
        seen = self.record.snapshot()
        bad = violations(seen)
        if bad:
            raise AssertionError(violation_report(bad))
        return summary(seen)

    def _list(self, pods: list[Obj]) -> None:
        for pod in pods:
            self._record(pod)
        if self._then_list is not None:
            self._then_list(pods)

    def _event(self, kind: str, pod: Obj) -> None:
        self._record(pod)
        if self._then_event is not None:
            self._then_event(kind, pod)

    def _record(self, pod: Mapping[str, Any]) -> None:
        ips = pod_addresses(pod.get("status"))
        if ips:
            meta = pod["metadata"]
            self.record.add(f"{meta['namespace']}/{meta['name']}", ips)


# ---- command line ----------------------------------------------------------------------------------------
def _watch_command(kubeconfig: Path, record_path: Path) -> int:
    with record_path.open("a") as sink:
        guard = PodIPWatch(kubeconfig, PodIPRecord(sink))
        done = threading.Event()

        def on_signal(_signum: int, _frame: FrameType | None) -> None:
            done.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        guard.start()
        sink.write(READY_LINE + "\n")
        sink.flush()
        done.wait()
        guard.stop()
    return 0


def _check_command(record_path: Path) -> int:
    seen = read_record(record_path)
    bad = violations(seen)
    if bad:
        sys.stderr.write(violation_report(bad) + "\n")
        return 1
    print(summary(seen))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testkit.loopback", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    watch_p = commands.add_parser("watch", help="record every pod address until SIGTERM/SIGINT")
    watch_p.add_argument("--kubeconfig", type=Path, required=True)
    watch_p.add_argument("--record", type=Path, required=True, help="file the addresses are appended to")
    check_p = commands.add_parser("check", help="exit 1 naming every pod whose address is not loopback")
    check_p.add_argument("record", type=Path)
    args = parser.parse_args(argv)
    if args.command == "watch":
        return _watch_command(args.kubeconfig, args.record)
    return _check_command(args.record)


if __name__ == "__main__":
    sys.exit(main())
