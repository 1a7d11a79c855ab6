"""The upgrade check's table (Markdown): the upgrade's and the leader kill's figures, requests by outcome,
violations; printed, and written into docs/benchmarks.md between ``<!-- bench:upgrade:start -->`` and
``<!-- bench:upgrade:end -->`` (``bench.report.replace_block``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.report import replace_block
from bench.soak.auditor import Violation
from bench.upgrade import judge

START_MARK = "<!-- bench:upgrade:start -->"
END_MARK = "<!-- bench:upgrade:end -->"


@dataclass
class UpgradeResult:
    """What one run found (None: not reached or not measured)."""

    command: str
    machine: str
    install_s: float | None = None
    upgrade_s: float | None = None
    roll_s: float | None = None
    not_rolled: list[str] = field(default_factory=list)
    takeover_s: float | None = None
    first_act_s: float | None = None
    scale_edits: int = 0
    writes: dict[str, int] = field(default_factory=dict)
    writes_not_leader: int = 0
    refused: int = 0
    upgrade_requests: dict[str, int] = field(default_factory=dict)
    leader_requests: dict[str, int] = field(default_factory=dict)
    drain_requests: dict[str, int] = field(default_factory=dict)
    drain_s: float | None = None
    drain_gap_s: float | None = None
    requests: dict[str, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    events: dict[str, int] = field(default_factory=dict)
    noted: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


def _s(value: float | None, missing: str = "not measured") -> str:
    return missing if value is None else f"{value:.1f} s"


def request_row(label: str, counts: dict[str, int]) -> str:
    """| label | sent | answered | retryable | hung up | not connected | lost |"""
    sent = sum(counts.values())
    return f"| {label} | {sent} | " + " | ".join(str(counts.get(o, 0)) for o in judge.OUTCOMES) + " |"


def table(r: UpgradeResult) -> str:
    leader = {k: r.leader_requests.get(k, 0) - r.upgrade_requests.get(k, 0) for k in r.leader_requests}
    lines = [
        f"Upgrade check (`{r.command}`, {r.machine}): "
        f"{'no violation' if r.ok else f'{len(r.violations)} VIOLATION(S)'}.",
        "",
        "| requests | sent | answered | retryable (429/503 + Retry-After) | hung up (on purpose) "
        "| not connected (nothing sent) | lost |",
        "|---|---:|---:|---:|---:|---:|---:|",
        request_row("0.2.0 installed, `helm upgrade`, roll-over", r.upgrade_requests),
        request_row("leader SIGKILLed while a pool scales", leader),
        request_row("`kubectl drain` of a pool's node (all pools)", r.drain_requests),
        request_row("all", r.requests),
        "",
        "| check | result |",
        "|---|---:|",
        f"| `helm install` of 0.2.0 (`--wait`) | {_s(r.install_s)} |",
        f"| `helm upgrade` to this tree (`--wait`) | {_s(r.upgrade_s)} |",
        f"| every worker on the new release, converged (bound 120 s) | {_s(r.roll_s, 'NOT ROLLED')} |",
        f"| leader SIGKILL -> the standby holds the Lease (bound 15 s) | {_s(r.takeover_s)} |",
        f"| leader SIGKILL -> the new leader's first other write | {_s(r.first_act_s)} |",
        f"| pool scale edits during the kill | {r.scale_edits} |",
        f"| `kubectl drain` of the node with a pool's 2 workers | {_s(r.drain_s)} |",
        f"| that pool without a Ready worker during the drain (must be 0) | {_s(r.drain_gap_s)} |",
        *(f"| writes by {name} (audit log) | {n} |" for name, n in sorted(r.writes.items())),
        f"| writes by a replica while it did not hold the Lease (must be 0) | {r.writes_not_leader} |",
        f"| requests of the replicas refused, 403 (must be 0) | {r.refused} |",
        f"| events audited (pods / ModelPools / ModelBudget) | {r.events.get('pod', 0)} / "
        f"{r.events.get('modelpools', 0)} / {r.events.get('modelbudgets', 0)} |",
        *(f"| noted (not a violation): {what} | {n} |" for what, n in r.noted.items()),
        f"| violations (must be 0) | {len(r.violations)} |",
    ]
    if r.violations:
        lines += ["", "| at s | invariant | what | event |", "|---:|---|---|---|"]
        lines += [f"| {v.at:.1f} | {v.rule} | {v.detail} | {v.event} |" for v in r.violations[:40]]
        if len(r.violations) > 40:
            lines.append(f"| | | ... {len(r.violations) - 40} more | |")
    return "\n".join(lines)


def write_docs(r: UpgradeResult) -> None:
    replace_block(table(r), START_MARK, END_MARK)
