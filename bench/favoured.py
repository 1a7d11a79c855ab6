"""``python -m bench.favoured CMD [ARGS...]``: run a whole benchmark (its cluster, servers and clients
included: every process it starts is born in the cgroup) in a favoured cgroup (``bench.cgroups``), so on a
machine shared with other work its figures measure the code, not the neighbours' preemption.  Say so
with the figures: the machine's other work runs slower meanwhile, not the benchmark."""

from __future__ import annotations

import subprocess
import sys

from bench.cgroups import favoured


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    with favoured():
        return subprocess.run(argv, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
