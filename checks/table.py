"""The readiness table: one row per check, coloured by status, the fix under each failure."""

from __future__ import annotations

import click

from checks import FAIL, PASS, WARN, Check


def render(checks: list[Check], title: str = "readiness") -> str:
    widths = [max(len(getattr(c, f)) for c in checks) for f in ("node", "item", "status")]
    lines = []
    for check in checks:
        row = f"{check.node:<{widths[0]}}  {check.item:<{widths[1]}}  {check.status:<{widths[2]}}  {check.detail}"
        lines.append(click.style(row, fg={PASS: "green", FAIL: "red", WARN: "yellow"}[check.status]))
        indent = " " * (widths[0] + widths[1] + widths[2] + 6)
        if check.fix:
            lines.append(indent + f"fix: {check.fix}")
        lines += [click.style(indent + "| " + line[:160], dim=True) for line in check.lines]
    failed = sum(c.status == FAIL for c in checks)
    lines.append(f"{title}: {len(checks) - failed} of {len(checks)} checks pass" + (f", {failed} FAIL" if failed else ""))
    return "\n".join(lines)


def failure_summary(checks: list[Check]) -> str:
    return "; ".join(f"{c.node}: {c.item}: {c.detail}" for c in checks if c.status == FAIL)
