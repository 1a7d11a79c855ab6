"""A debugging switch: where the operator's memory goes (``MODELPOOL_TRACEMALLOC``).

``MODELPOOL_TRACEMALLOC=<directory>`` starts ``tracemalloc`` before Kopf runs
(``MODELPOOL_TRACEMALLOC_FRAMES`` frames per allocation, 12 by default; 0: no tracing, the summaries only)
and makes ``SIGUSR2`` write there a snapshot (``snapshot-<pid>-<n>.tracemalloc``, for
``tracemalloc.Snapshot.load``: group it offline, the operator only dumps it) and beside it
``summary-<pid>-<n>.json``: the traced memory (and tracemalloc's own), the process's RSS, the C
allocator's view (glibc ``mallinfo2``: in use, and free but kept, the fragmentation Python cannot see),
the live objects by type and the deep sizes of the operator's and Kopf's long-lived structures. Off (the
variable unset or empty) nothing is started or installed: tracing slows every allocation and doubles the
memory they take, so it is for measuring only.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import gc
import json
import os
import signal
import sys
import tracemalloc
from collections.abc import Mapping
from pathlib import Path
from types import BuiltinFunctionType, CodeType, FrameType, FunctionType, MethodType, ModuleType
from typing import Any

ENV_DIRECTORY = "MODELPOOL_TRACEMALLOC"
ENV_FRAMES = "MODELPOOL_TRACEMALLOC_FRAMES"
_DEFAULT_FRAMES = 12
_TOP_TYPES = 40


def install(environ: Mapping[str, str]) -> Path | None:
    """Start tracing and the ``SIGUSR2`` dump when the environment asks for it; the directory, else None."""
    where = environ.get(ENV_DIRECTORY, "")
    if not where:
        return None
    directory = Path(where)
    directory.mkdir(parents=True, exist_ok=True)
    frames = int(environ.get(ENV_FRAMES) or _DEFAULT_FRAMES)
    if frames > 0:  # 0: the summaries only (cheap: no tracing at all)
        tracemalloc.start(frames)
    state = {"taken": 0, "busy": False}

    def dump(_signum: int, _frame: FrameType | None) -> None:
        if state["busy"]:  # a signal during a dump: that dump is what was asked for
            return
        state["busy"], state["taken"] = True, state["taken"] + 1
        try:
            write_snapshot(directory, int(state["taken"]))
        finally:
            state["busy"] = False

    signal.signal(signal.SIGUSR2, dump)
    return directory


def write_snapshot(directory: Path, number: int) -> Path:
    """Write the current snapshot (when tracing) and its summary; the snapshot's path."""
    stem = f"{os.getpid()}-{number}"
    path = directory / f"snapshot-{stem}.tracemalloc"
    if tracemalloc.is_tracing():
        tracemalloc.take_snapshot().dump(str(path))
    (directory / f"summary-{stem}.json").write_text(json.dumps(summary(), indent=1) + "\n")
    return path


def summary() -> dict[str, Any]:
    """What the process holds, as far as it can tell without tracebacks."""
    current, peak = tracemalloc.get_traced_memory()
    types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    return {
        "traced_mib": current / 2**20,
        "traced_peak_mib": peak / 2**20,
        "tracemalloc_own_mib": tracemalloc.get_tracemalloc_memory() / 2**20,
        "rss_mib": _rss_kib() / 1024,
        "malloc": _mallinfo(),
        "rss_by_mapping_mib": _rss_by_mapping(),
        "tasks": _tasks(),
        "objects_by_type": dict(types.most_common(_TOP_TYPES)),
        "structures_mib": structures(),
        "http_connections": _connections(),
    }


def _connections() -> list[dict[str, int]]:
    """Each aiohttp connector's limit and connections (in use, idle): a TLS connection holds a 256 KiB
    read buffer (asyncio's ``SSLProtocol``) plus OpenSSL's own."""
    found = []
    for obj in gc.get_objects():
        if type(obj).__name__ == "TCPConnector":
            idle = sum(len(conns) for conns in getattr(obj, "_conns", {}).values())
            found.append({"limit": obj.limit, "in_use": len(getattr(obj, "_acquired", ())), "idle": idle})
    return found


# The structures whose deep sizes a summary reports, by class name, in this order: what an earlier one
# reaches is not counted again (the indices before Kopf's per-object memories, which reach the memo).
_STRUCTURES = (
    "OperatorIndexers",
    "StatsScraper",
    "ObservationCache",
    "ChargeCache",
    "ReservationBook",
    "Bookkeeping",
    "Services",
    "ResourceMemories",
)
_OPAQUE = (type, ModuleType, FunctionType, BuiltinFunctionType, MethodType, FrameType, CodeType)


def structures() -> dict[str, float]:
    """The deep size (MiB) of each live instance of ``_STRUCTURES`` (summed by class; Kopf's indices by
    index), each object counted once."""
    found: dict[str, list[Any]] = {name: [] for name in _STRUCTURES}
    for obj in gc.get_objects():
        name = type(obj).__name__
        if name in found:
            found[name].append(obj)
    seen: set[int] = set()
    sizes: dict[str, float] = {}
    for name in _STRUCTURES:
        for obj in found[name]:
            if name == "OperatorIndexers":
                for handler_id, indexer in obj.items():
                    key = f"index {handler_id}"
                    sizes[key] = sizes.get(key, 0.0) + _deep_size(indexer, seen) / 2**20
            else:
                sizes[name] = sizes.get(name, 0.0) + _deep_size(obj, seen) / 2**20
    return sizes


def _deep_size(root: Any, seen: set[int]) -> int:
    total, stack = 0, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _OPAQUE):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj, 0)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif isinstance(obj, str | bytes | int | float | bool) or obj is None:
            continue
        else:
            state = getattr(obj, "__dict__", None)
            if isinstance(state, dict):
                stack.append(state)
            for slot in getattr(type(obj), "__slots__", ()):
                value = getattr(obj, slot, None)
                if value is not None:
                    stack.append(value)
    return total


def _rss_kib() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _rss_by_mapping() -> dict[str, float]:
    """RSS (MiB) by kind of mapping (``/proc/self/smaps``): the C heap, anonymous mappings (pymalloc's
    arenas, large buffers, threads' malloc arenas and stacks), each file (shared libraries) summed."""
    sizes: dict[str, float] = collections.defaultdict(float)
    kind = "anon"
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        fields = line.split()
        if fields and "-" in fields[0] and ":" not in fields[0]:  # a mapping's header line
            kind = fields[5] if len(fields) > 5 else "anon"
            kind = "file" if kind.startswith("/") else kind
        elif fields and fields[0] == "Rss:":
            sizes[kind] += int(fields[1]) / 1024
    return {name: round(size, 1) for name, size in sizes.items() if size >= 0.1}


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo() -> dict[str, float]:
    """glibc's ``mallinfo2`` in MiB (empty elsewhere): ``arena`` from the heap, ``hblkhd`` mmapped,
    ``uordblks`` in use, ``fordblks`` free but not given back."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        call = libc.mallinfo2
    except (OSError, AttributeError, TypeError):
        return {}
    call.restype = _MallInfo2
    info = call()
    return {field[0]: getattr(info, field[0]) / 2**20 for field in _MallInfo2._fields_}


def _tasks() -> int:
    import asyncio

    try:
        return len(asyncio.all_tasks())
    except RuntimeError:  # no running loop (the signal came between two)
        return -1
