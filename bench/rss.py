"""The server's resident memory under load: sampled once a second while a run goes on."""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable


class RssSampler:
    """Samples ``read()`` (the server's RSS) once a second, in a thread, while a run goes on, and once
    more at the end (``ServerProcess.rss_bytes`` uses httpx's Client, which is thread-safe; the main
    thread only waits for the clients meanwhile)."""

    def __init__(self, read: Callable[[], int], period: float = 1.0) -> None:
        self.read = read
        self.period = period
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.samples.append(self.read())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.read())


def rss_levels(samples: list[int], warmup_s: float, window: int = 5) -> tuple[float, float]:
    """(first, last) RSS level of a run sampled once a second: medians of the first ``window`` samples
    after the warm-up and of the last ``window``.

    RSS at any one instant includes the activations of the batch being computed and the freed blocks
    glibc returns every few seconds (a saw-tooth of tens of MiB on a CPU), so a level is a median."""
    warm = round(warmup_s)
    return statistics.median(samples[warm : warm + window]), statistics.median(samples[-window:])
