"""A check's outcome and the node report built from them (JSON, Markdown, verdict, Slurm drain reason)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "skip"]
DRAIN_MAX = 250  # characters Slurm keeps of a node's Reason (scontrol truncates longer ones)
DRAIN_PREFIX = "lcm-health: "


@dataclass(frozen=True)
class Check:
    """One check on one node: what was found (value) against what is expected (expected/threshold)."""

    node: str
    name: str
    status: Status
    value: str
    expected: str
    reason: str = ""

    def line(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.status.upper():4} {self.name}: {self.value} (expected {self.expected}){why}"


def check(node: str, name: str, ok: bool, value: Any, expected: Any, reason: str = "") -> Check:
    return Check(node, name, "pass" if ok else "fail", str(value), str(expected), "" if ok else reason)


def skip(node: str, name: str, reason: str, expected: Any = "", value: Any = "-") -> Check:
    return Check(node, name, "skip", str(value), str(expected), reason)


@dataclass
class Report:
    node: str
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def healthy(self) -> bool:
        return not self.failed

    @property
    def verdict(self) -> str:
        counts = {s: sum(c.status == s for c in self.checks) for s in ("pass", "fail", "skip")}
        word = "HEALTHY" if self.healthy else "UNHEALTHY"
        return f"{self.node}: {word} ({counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skip)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": 1,
            "node": self.node,
            "healthy": self.healthy,
            "verdict": self.verdict,
            "failed": [c.name for c in self.failed],
            "checks": [asdict(c) for c in self.checks],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    def to_markdown(self) -> str:
        def cell(text: str) -> str:
            return text.replace("|", "\\|").replace("\n", " ")

        rows = [
            f"# Node health: {self.node}",
            "",
            f"**{self.verdict}**",
            "",
            "| Check | Status | Value | Expected | Reason |",
            "|---|---|---|---|---|",
        ]
        for c in self.checks:
            rows.append(
                f"| `{c.name}` | {c.status} | {cell(c.value)} | {cell(c.expected)} | {cell(c.reason)} |"
            )
        return "\n".join(rows) + "\n"

    def drain_reason(self) -> str:
        """One line naming the failing checks, at most DRAIN_MAX characters ('+N more' when cut)."""
        names = [c.name for c in self.failed]
        if not names:
            return ""
        out = DRAIN_PREFIX + ",".join(names)
        if len(out) <= DRAIN_MAX:
            return out
        for keep in range(len(names) - 1, 0, -1):
            out = DRAIN_PREFIX + ",".join(names[:keep]) + f" +{len(names) - keep} more"
            if len(out) <= DRAIN_MAX:
                return out
        return (DRAIN_PREFIX + names[0])[: DRAIN_MAX - 8] + f" +{len(names) - 1} more"
