"""An OpenTelemetry Collector on loopback, for the tests and the bench of traces
(``modelpool_contract.tracing``).

``Collector`` runs ``bin/otelcol`` (``make testbin``: the Collector's OTLP receiver and its file exporter,
built from the Go module proxy, ``hack/testbin/otelcol``) with a configuration of its own: OTLP/HTTP on
a free loopback port (``url`` is what ``--otlp-endpoint`` takes), every span written as OTLP JSON lines to
a file, flushed every 100 ms.  ``spans()`` reads them back as ``Received`` values: ids in hex, the parent's,
the service that sent it and its resource, the attributes as plain values.  So the exporters are tested
against the receiver a cluster runs, not a stand-in."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testkit.environment import ROOT, free_port
from testkit.waiting import wait_for

OTELCOL = ROOT / "bin" / "otelcol"
_ERROR = 2  # OTLP's status code


@dataclass(frozen=True)
class Received:
    """One span as the Collector wrote it."""

    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    name: str
    kind: int  # OTLP's enum: 1 internal, 2 server, 3 client
    service: str  # its resource's service.name
    start_ns: int
    end_ns: int
    error: bool  # status ERROR
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)  # its resource's attributes
    events: tuple[str, ...] = ()  # the names of its events, in order


def _value(value: dict[str, Any]) -> Any:
    if "intValue" in value:  # OTLP JSON writes 64-bit integers as strings
        return int(value["intValue"])
    for kind in ("stringValue", "boolValue", "doubleValue"):
        if kind in value:
            return value[kind]
    return value


def _attributes(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    return {pair["key"]: _value(pair.get("value", {})) for pair in pairs}


def decode(line: str) -> list[Received]:
    """The spans of one line of the file exporter's OTLP JSON (one export request)."""
    spans: list[Received] = []
    for resource_spans in json.loads(line).get("resourceSpans", []):
        resource = _attributes(resource_spans.get("resource", {}).get("attributes", []))
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                spans.append(
                    Received(
                        trace_id=span["traceId"],
                        span_id=span["spanId"],
                        parent_id=span.get("parentSpanId", ""),
                        name=span["name"],
                        kind=int(span.get("kind", 0)),
                        service=str(resource.get("service.name", "")),
                        start_ns=int(span["startTimeUnixNano"]),
                        end_ns=int(span["endTimeUnixNano"]),
                        error=span.get("status", {}).get("code") == _ERROR,
                        attributes=_attributes(span.get("attributes", [])),
                        resource=resource,
                        events=tuple(event["name"] for event in span.get("events", [])),
                    )
                )
    return spans


def config(port: int, out: Path) -> dict[str, Any]:
    """The Collector's configuration: OTLP/HTTP on loopback in, a JSON lines file out, no telemetry of its
    own (no metrics port: several collectors may run at once)."""
    return {
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{port}"}}}},
        "exporters": {"file": {"path": str(out), "flush_interval": "100ms"}},
        "service": {
            "telemetry": {"metrics": {"level": "none"}},
            "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["file"]}},
        },
    }


class Collector:
    """``bin/otelcol`` for one test module or bench run (module docstring); ``close()`` stops it."""

    def __init__(self, workdir: Path) -> None:
        if not OTELCOL.exists():
            raise RuntimeError(f"{OTELCOL} is missing (run: make testbin)")
        self.port = free_port()
        self.out = workdir / "spans.jsonl"
        self.log = workdir / "otelcol.log"
        path = workdir / "otelcol.yaml"
        path.write_text(yaml.safe_dump(config(self.port, self.out)))
        self._lock = threading.Lock()
        self._read = 0
        self._spans: list[Received] = []
        self._proc = subprocess.Popen(
            [str(OTELCOL), "--config", str(path)],
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(self._listening, timeout=60, message=lambda: f"otelcol listening\n{self.log.read_text()}")

    def _listening(self) -> bool:
        if self._proc.poll() is not None:
            raise RuntimeError(f"otelcol exited {self._proc.returncode}:\n{self.log.read_text()}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self, trace_id: str | None = None) -> list[Received]:
        """What the Collector has written so far (of one trace, when given); only whole lines count."""
        with self._lock:
            if self.out.exists():
                with self.out.open("rb") as file:
                    file.seek(self._read)
                    data = file.read()
                whole = data[: data.rfind(b"\n") + 1]
                self._read += len(whole)
                for line in whole.decode().splitlines():
                    if line.strip():
                        self._spans.extend(decode(line))
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def by_name(spans: list[Received], name: str) -> Received:
    """The one span of that name (an AssertionError naming what there is otherwise)."""
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{len(found)} spans named {name!r} in {sorted(s.name for s in spans)}"
    return found[0]


__all__ = ["OTELCOL", "Collector", "Received", "by_name", "config", "decode"]
