"""Readiness rules as pure functions: readings in, rows out. Each failing row says what is wrong
and the fix. No module here reads a host or prints; `operations/verify.py` gathers the readings
(`facts/verify.py`) and `checks/table.py` renders the rows."""

from dataclasses import dataclass

PASS, FAIL, WARN = "PASS", "FAIL", "WARN"


@dataclass(frozen=True)
class Check:
    node: str
    item: str
    status: str
    detail: str
    fix: str = ""
    lines: tuple[str, ...] = ()  # evidence shown under the row: the last lines of a failing side's log
