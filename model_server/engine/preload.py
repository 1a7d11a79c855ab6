"""Load torch's shared libraries without holding the GIL, before ``import torch`` does it with the GIL.

``import torch`` spends about half a second in ``dlopen`` of libtorch (more with the CUDA libraries),
and Python's own loaders (the import system, ``ctypes.CDLL``) hold the GIL while they do, so the event
loop, and with it ``/v2/health/live``, stalls for that long.  ``dlopen`` called as a foreign function
through ctypes runs with the GIL released.  Once the libraries are in the process, the import's own
``dlopen`` finds them loaded and returns at once.  Best effort: on any failure the import loads them
as it always would.  Linux (glibc) only.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import sys
from pathlib import Path

from model_server.libc import libc_function

log = logging.getLogger("modelpool.preload")

# What torch's import loads first (``_load_global_deps``, RTLD_GLOBAL), then libtorch itself, which pulls
# in libtorch_cpu, libc10 and, in CUDA builds, libtorch_cuda and the CUDA runtime through its RPATH.
# Python extension modules are left to the import: their initialisation needs the GIL.
_LIBRARIES = (("libtorch_global_deps.so", True), ("libtorch.so", False))
_RTLD_NOW = 2
_RTLD_GLOBAL = 0x100


def torch_library_dir() -> Path | None:
    """Where the installed torch keeps its shared libraries (found without importing torch)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "lib"


def preload_torch_libraries() -> list[str]:
    """dlopen torch's libraries with the GIL released; returns the names that were loaded."""
    if not sys.platform.startswith("linux") or "torch" in sys.modules:
        return []
    libdir = torch_library_dir()
    if libdir is None:
        return []
    dlopen = libc_function("dlopen", [ctypes.c_char_p, ctypes.c_int], ctypes.c_void_p)
    if dlopen is None:
        return []
    loaded = []
    for name, global_ in _LIBRARIES:
        path = libdir / name
        if not path.is_file():
            continue
        # A CDLL foreign call releases the GIL for its duration (unlike ctypes.CDLL(path) itself).
        if dlopen(str(path).encode(), _RTLD_NOW | (_RTLD_GLOBAL if global_ else 0)):
            loaded.append(name)
        else:
            log.debug("preloading %s failed; import torch will load it", name)
    return loaded


__all__ = ["preload_torch_libraries", "torch_library_dir"]
