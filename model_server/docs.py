"""Generate the v2 tensor contract table of docs/server.md from the task classes.

``python -m model_server.docs --write`` rewrites the block between the markers; a test fails when the
checked-in table is out of date.  Importing the task modules is cheap (torch is only imported on load).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from model_server.tasks import REGISTRY, import_class

START, END = "<!-- tensors:start -->", "<!-- tensors:end -->"
_ROOT = Path(__file__).resolve().parents[1]
DOCS = (_ROOT / "docs" / "server.md",)


def tensor_table() -> str:
    """Markdown: one row per task and tensor (name, direction, datatype, shape, optional)."""
    rows = [
        "| task | tensor | in/out | datatype | shape | batched by the server |",
        "|---|---|---|---|---|---|",
    ]
    for task, spec in REGISTRY.items():
        cls = import_class(spec)
        for direction, tensors in (("input", cls.v2_inputs), ("output", cls.v2_outputs)):
            for t in tensors:
                shape = "[" + ", ".join(str(d) for d in t.shape) + "]"
                opt = " (optional)" if t.optional else ""
                rows.append(
                    f"| `{task}` | `{t.name}`{opt} | {direction} | {t.datatype} | {shape} | "
                    f"{'yes' if cls.batchable else 'no'} |"
                )
    return "\n".join(rows)


def render(doc: str) -> str:
    """``doc`` with the block between the markers replaced by the current table."""
    head, rest = doc.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{tensor_table()}\n{END}{tail}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite the tables in place")
    args = parser.parse_args()
    for doc in DOCS:
        current = doc.read_text()
        fresh = render(current)
        if args.write:
            doc.write_text(fresh)
        elif fresh != current:
            sys.exit(f"{doc.name}: tensor table is out of date: python -m model_server.docs --write")


if __name__ == "__main__":
    main()
