"""The soak's table (Markdown): faults by kind, requests by outcome, invariant violations with the event
that showed each, time to converge, RSS; printed, and written into docs/benchmarks.md between
``<!-- bench:soak:start -->`` and ``<!-- bench:soak:end -->`` (``bench.report.replace_block``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.report import replace_block
from bench.soak.auditor import Violation

START_MARK = "<!-- bench:soak:start -->"
END_MARK = "<!-- bench:soak:end -->"
MIB = 2**20


@dataclass
class SoakResult:
    """What one soak run found."""

    command: str
    seconds: float
    machine: str
    faults: dict[str, tuple[int, int]]  # kind -> (applied, skipped: nothing to act on)
    requests: dict[str, int]
    violations: list[Violation]
    converge_s: float | None
    rss: dict[str, tuple[int, int, int, int, float]]  # role -> first, last, peak, processes, seconds
    events: dict[str, int] = field(default_factory=dict)
    noted: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


def table(r: SoakResult) -> str:
    lines = [
        f"Soak (`{r.command}`, {r.seconds / 60:.1f} min of faults, {r.machine}): "
        f"{'no invariant violated' if r.ok else f'{len(r.violations)} INVARIANT VIOLATION(S)'}.",
        "",
        "| faults by kind | applied | skipped (nothing to act on) |",
        "|---|---:|---:|",
        *(f"| {kind} | {done} | {skipped} |" for kind, (done, skipped) in sorted(r.faults.items())),
        "",
        "| requests by outcome | count |",
        "|---|---:|",
        *(f"| {outcome} | {n} |" for outcome, n in sorted(r.requests.items())),
        "",
        "| check | result |",
        "|---|---:|",
        f"| invariant violations (must be 0) | {len(r.violations)} |",
        f"| events audited (pods / ModelPools / ModelBudget) | {r.events.get('pod', 0)} / "
        f"{r.events.get('modelpools', 0)} / {r.events.get('modelbudgets', 0)} |",
        f"| time to converge after the last fault (bound 120 s) | "
        f"{'not converged' if r.converge_s is None else f'{r.converge_s:.1f} s'} |",
        *(
            f"| {role} RSS, longest-lived of {procs} processes: first / last ({span:.0f} s apart); "
            f"peak of all | {first / MIB:.0f} / {last / MIB:.0f} MiB; {peak / MIB:.0f} MiB |"
            for role, (first, last, peak, procs, span) in sorted(r.rss.items())
        ),
        *(
            f"| noted (not a violation, see bench/soak/auditor.py): {what} | {n} |"
            for what, n in r.noted.items()
        ),
    ]
    if r.violations:
        lines += ["", "| at s | invariant | what | event |", "|---:|---|---|---|"]
        lines += [f"| {v.at:.1f} | {v.rule} | {v.detail} | {v.event} |" for v in r.violations]
    return "\n".join(lines)


def write_docs(r: SoakResult) -> None:
    """The table into docs/benchmarks.md, between the soak markers."""
    replace_block(table(r), START_MARK, END_MARK)
