"""Reading and writing prompt rows as parquet or JSON Lines, with errors that name the file and the row.

A *row* is one JSON object / parquet record (a dict); what its keys must be is checked in
:mod:`hybridrl.data.records`. Errors found here — a missing or empty file, an unreadable parquet file, bytes that are
not UTF-8, a line that is not a JSON object — are ``ValueError``\\ s naming the file, and for JSONL the line
(1-based) and the row (0-based, blank lines not counted).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SUPPORTED_SUFFIXES", "SourceRow", "RowFile", "read_rows", "write_rows"]

SUPPORTED_SUFFIXES = (".parquet", ".jsonl")
_SUFFIX_NAMES = " or ".join(SUPPORTED_SUFFIXES)


@dataclass(frozen=True)
class SourceRow:
    """One row and where it came from (``where`` is ready to start an error message)."""

    row: dict[str, Any]
    where: str


@dataclass(frozen=True)
class RowFile:
    """The rows of one file; ``columns`` is known for parquet (one schema per file) and ``None`` for JSONL."""

    path: Path
    rows: list[SourceRow]
    columns: tuple[str, ...] | None


def read_rows(path: str | Path) -> RowFile:
    """All rows of a ``.parquet`` or ``.jsonl`` file.

    Raises:
        ValueError: naming the file (and row/line) if it is missing, not a supported type, empty, unreadable,
            not UTF-8, or holds a line that is not a JSON object.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"data file {str(path)!r} does not exist or is not a file")
    if path.suffix not in SUPPORTED_SUFFIXES:
        raise ValueError(f"data file {str(path)!r}: unsupported type {path.suffix!r}; use {_SUFFIX_NAMES}")
    result = _read_parquet(path) if path.suffix == ".parquet" else _read_jsonl(path)
    if not result.rows:
        raise ValueError(f"data file {str(path)!r} is empty (no rows)")
    return result


def _read_parquet(path: Path) -> RowFile:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as error:
        raise ValueError(f"data file {str(path)!r} is not a readable parquet file: {error}") from None
    rows = [SourceRow(row, f"{path}: row {index}") for index, row in enumerate(table.to_pylist())]
    return RowFile(path, rows, tuple(table.column_names))


def _read_jsonl(path: Path) -> RowFile:
    rows: list[SourceRow] = []
    for line_number, raw_line in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not raw_line.strip():
            continue
        where = f"{path}: row {len(rows)} (line {line_number})"
        try:
            text = raw_line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{where} is not valid UTF-8 (byte 0x{raw_line[error.start]:02x} at offset {error.start})"
            ) from None
        try:
            row = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where} is not valid JSON: {error.msg} (column {error.colno})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where} is a JSON {type(row).__name__}, expected an object with the row's columns")
        rows.append(SourceRow(row, where))
    return RowFile(path, rows, None)


def write_rows(rows: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """Write rows to ``path`` (``.parquet`` via pyarrow, or ``.jsonl``), creating parent folders. Returns ``path``.

    Parquet needs every row to have the same structure (pyarrow infers one schema from all rows).
    """
    path = Path(path)
    rows = [dict(row) for row in rows]
    if path.suffix not in SUPPORTED_SUFFIXES:
        raise ValueError(f"output file {str(path)!r}: unsupported type {path.suffix!r}; use {_SUFFIX_NAMES}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        with path.open("w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
