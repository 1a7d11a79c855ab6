"""``modelpool-server``: parse the config (exit 2 when invalid), listen, then load the model.

Heavy imports (torch, transformers, diffusers) happen in the worker's load, after the socket listens,
so ``/v2/health/live`` answers from the first moment.  SIGTERM -> Evicting and drain (exit 0); a load
failure exits 3, a fatal device error 4 (``modelpool_contract.exits``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from collections.abc import Sequence
from types import FrameType

from model_server.config import ConfigError, ServerConfig, load_config
from modelpool_contract.exits import EXIT_CONFIG


def _serve(config: ServerConfig) -> int:
    # Imported here, after the config is valid: a bad flag exits 2 without paying for the web stack.
    import uvicorn

    from model_server.endpoints import build_app
    from model_server.server import ModelServer

    server = ModelServer(config)
    app = build_app(server)

    class HTTPServer(uvicorn.Server):
        """uvicorn, with SIGTERM/SIGINT routed into a drain and the load started once listening."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.should_exit:  # a second signal: stop now
                self.force_exit = True
                return
            loop = self._loop
            loop.call_soon_threadsafe(server.begin_drain)

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            self._loop = asyncio.get_running_loop()
            await super().startup(sockets)
            if not self.should_exit:
                server.start(stop=self._stop)

        def _stop(self) -> None:
            self.should_exit = True

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            await super().shutdown(sockets)
            await server.close()

    http = HTTPServer(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level=config.log_level,
            access_log=False,
            # No access log, so X-Forwarded-* would never be read: skip that per-request middleware.
            proxy_headers=False,
            timeout_graceful_shutdown=5,
            lifespan="off",
        )
    )
    http.run()
    return server.exit_code


def _exit(code: int) -> None:
    """Exit now, even if the inference thread is still inside a load or a forward pass (it cannot be
    interrupted, and the interpreter would otherwise join it at exit)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> None:
    try:
        config = load_config(argv)
    except ConfigError as exc:
        print(f"modelpool-server: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    _exit(_serve(config))


if __name__ == "__main__":
    main()
