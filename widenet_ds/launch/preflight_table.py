"""The preflight's table: one row per check with its result, the nodes that fail it, what was found and, for a failure,
its fix (launch/preflight_rank.py prints it on rank 0). Torch-free: rows are plain values gathered from every rank."""

from __future__ import annotations

from dataclasses import dataclass

OK, FAIL, SKIPPED = "ok", "FAIL", "skipped"
COLUMNS = ("check", "result", "node", "found")


@dataclass(frozen=True)
class Row:
    check: str
    result: str                      # OK, FAIL or SKIPPED (a check that could not run: an earlier one failed)
    found: str
    nodes: tuple[str, ...] = ()      # the nodes that fail it (none: every node, or a failure of no node's own)
    fix: str = ""

    @property
    def passed(self) -> bool:
        return self.result == OK


def passed(check: str, found: str) -> Row:
    return Row(check, OK, found)


def failed(check: str, found: str, fix: str, nodes=()) -> Row:
    return Row(check, FAIL, found, tuple(nodes), fix)


def skipped(check: str, why: str) -> Row:
    return Row(check, SKIPPED, why)


def table_lines(rows: list[Row]) -> list[str]:
    """The rows under a header, in columns; a failure's fix on the line below it, under its finding."""
    width = [max(len(COLUMNS[0]), *(len(r.check) for r in rows)), len(SKIPPED),
             max(len(COLUMNS[2]), *(len(", ".join(r.nodes) or "-") for r in rows))]
    indent = sum(width) + 2 * len(width)

    def line(check: str, result: str, node: str, found: str) -> str:
        return f"{check:<{width[0]}}  {result:<{width[1]}}  {node:<{width[2]}}  {found}"

    lines = [line(*COLUMNS)]
    for row in rows:
        lines.append(line(row.check, row.result, ", ".join(row.nodes) or "-", row.found))
        if row.fix:
            lines.append(f"{'':<{indent}}fix: {row.fix}")
    return lines


def verdict(rows: list[Row], seconds: float) -> str:
    """The last line: every check passed, or which failed where."""
    failures = [r for r in rows if r.result == FAIL]
    if not failures:
        return f"preflight: all {len(rows)} checks passed in {seconds:.0f} s; the job can start"
    where = "; ".join(f"{r.check}" + (f" on {', '.join(r.nodes)}" if r.nodes else "") for r in failures)
    unrun = sum(r.result == SKIPPED for r in rows)
    return (f"preflight: {len(failures)} of {len(rows)} checks failed ({where})"
            + (f", {unrun} could not run" if unrun else "") + f", in {seconds:.0f} s; fix them and run the preflight "
            f"again")
