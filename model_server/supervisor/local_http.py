"""The supervisor's own small HTTP servers, defined once: a dedicated worker's probe port
(``probe_server``) and a shared host's probe port with its control API (``host_control``).

Both answer the kubelet's probes and the operator's ``/stats`` scrape from a thread of the supervisor,
which imports no web stack; so both need the same things, and each lost one when they were two copies:

* an IPv6 listener when the address is one (``--host ::``), as the serving port has;
* keep-alive (HTTP/1.1), as a scraper's connection pool expects;
* no Nagle: the head and the body go out in two writes, and with Nagle's algorithm the second waits for
  the client's delayed ACK of the first (40 ms measured on ``/stats``);
* no access log (a probe every two seconds), and one way to send an answer.
"""

from __future__ import annotations

import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class LocalHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server on ``address`` (IPv6 when the host is an IPv6 address) that
    ``serve_in_thread`` runs until ``shutdown``."""

    daemon_threads = True
    thread_name = "probe-port"

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name=self.thread_name, daemon=True)
        thread.start()
        return thread


class LocalHandler(BaseHTTPRequestHandler):
    """Keep-alive, no Nagle, no access log; ``send_body`` answers."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def send_body(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(HTTPStatus(status))
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """No access log: the probes come every few seconds."""


__all__ = ["LocalHTTPServer", "LocalHandler"]
