"""The shared GLUE TSVs rewritten in the formats the text-classification task reads (CSV, TSV, JSON lines, a JSON
list, Parquet), as a user's own files: written into a test's folder, never committed."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def glue_rows(tsv: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The header and the rows of a GLUE TSV, as GLUE's reader splits them (lines, then tabs)."""
    lines = tsv.read_text(encoding="utf-8").rstrip("\n").split("\n")
    header = lines[0].split("\t")
    return header, [dict(zip(header, line.split("\t"))) for line in lines[1:]]


def typed(rows: list[dict[str, str]], **types: type) -> list[dict[str, Any]]:
    """The rows with some fields as numbers (a JSON or Parquet file holds labels as numbers)."""
    return [{name: types[name](value) if name in types else value for name, value in row.items()} for row in rows]


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    """`rows` as the file its suffix names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = list(rows[0])
    if path.suffix == ".csv":
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, header)
            writer.writeheader()
            writer.writerows(rows)
    elif path.suffix == ".tsv":
        path.write_text("\n".join("\t".join(map(str, row)) for row in [header, *[r.values() for r in rows]]) + "\n",
                        encoding="utf-8")
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    elif path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        raise ValueError(path)
    return path
