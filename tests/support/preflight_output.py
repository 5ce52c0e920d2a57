"""The preflight's table as its tests read it from a launcher's output (launch/preflight_table.py writes it): a line
per check in columns under the header, a failure's fix on the line below; pdsh's `node1: ` prefixes dropped."""

from __future__ import annotations

from dataclasses import dataclass

ROWS = ("start-up checks", "torch", "CUDA", "GPU driver", "DeepSpeed", "DeepSpeed ops", "free memory", "free disk",
        "all-reduce", "all-to-all", "output folder", "data folder", "expert routing", "job's steps", "checkpoint",
        "clean-up")
HEADER = ["check", "result", "node", "found"]


@dataclass(frozen=True)
class Checked:
    result: str
    nodes: tuple[str, ...]
    found: str
    fix: str = ""


def read_table(output: str) -> tuple[dict[str, Checked], str]:
    """(check -> what the table says of it, in the table's order; the verdict line) of the one table in `output`."""
    lines = [line.split(": ", 1)[1] if line.startswith(("node1: ", "node2: ")) else line
             for line in output.splitlines()]
    headers = [i for i, line in enumerate(lines) if line.split() == HEADER]
    assert len(headers) == 1, f"{len(headers)} tables in the output:\n{output[-6000:]}"
    header = lines[headers[0]]
    result_at, node_at, found_at = (header.index(name) for name in HEADER[1:])
    rows: dict[str, Checked] = {}
    for line in lines[headers[0] + 1:]:
        if line.startswith("preflight: "):
            return rows, line
        if not line[:found_at].strip():  # the fix of the row above
            name, row = list(rows.items())[-1]
            rows[name] = Checked(row.result, row.nodes, row.found, line[found_at:].removeprefix("fix: "))
            continue
        nodes = line[node_at:found_at].strip()
        rows[line[:result_at].strip()] = Checked(line[result_at:node_at].strip(),
                                                 () if nodes == "-" else tuple(nodes.split(", ")), line[found_at:])
    raise AssertionError(f"no verdict after the table:\n{output[-6000:]}")
