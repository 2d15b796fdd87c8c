"""Reading prompt files: round trips, and every bad-file case names the file (and the row/line)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_helpers import make_row

from hybridrl.data.io import read_rows, write_rows


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_round_trip_keeps_rows_and_locations(tmp_path, suffix):
    rows = [make_row("1+1=", "2"), make_row("7-3=", "4", extra_info={"index": 1})]
    path = write_rows(rows, tmp_path / f"nested/rows{suffix}")
    result = read_rows(path)
    assert [item.row["prompt"] for item in result.rows] == [row["prompt"] for row in rows]
    assert [item.row["reward_model"]["ground_truth"] for item in result.rows] == ["2", "4"]
    assert result.rows[1].where.startswith(f"{path}: row 1")
    assert (result.columns is not None) == (suffix == ".parquet")


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "absent.parquet"
    with pytest.raises(ValueError, match="absent.parquet.*does not exist"):
        read_rows(path)


def test_unsupported_suffix_names_the_file(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("a,b\n")
    with pytest.raises(ValueError, match=r"rows.csv.*unsupported type '\.csv'"):
        read_rows(path)


@pytest.mark.parametrize("content", [b"", b"\n  \n\n"])
def test_empty_jsonl_is_refused(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="empty.jsonl.*is empty"):
        read_rows(path)


def test_parquet_without_rows_is_refused(tmp_path):
    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"data_source": pa.array([], pa.string())}), path)
    with pytest.raises(ValueError, match="empty.parquet.*is empty"):
        read_rows(path)


def test_non_utf8_line_names_file_row_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = json.dumps(make_row()).encode()
    path.write_bytes(good + b"\n\n" + b'{"data_source": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: row 1 \(line 3\) is not valid UTF-8 \(byte 0xe9"):
        read_rows(path)


def test_malformed_json_line_names_file_row_and_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(make_row()) + "\n" + '{"data_source": "x", "prompt": [\n')
    with pytest.raises(ValueError, match=r"broken.jsonl: row 1 \(line 2\) is not valid JSON"):
        read_rows(path)


def test_json_line_that_is_not_an_object_is_refused(tmp_path):
    path = tmp_path / "array.jsonl"
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"array.jsonl: row 0 \(line 1\) is a JSON list"):
        read_rows(path)


def test_corrupt_parquet_names_the_file(tmp_path):
    path = tmp_path / "corrupt.parquet"
    path.write_bytes(b"this is not parquet at all" * 10)
    with pytest.raises(ValueError, match="corrupt.parquet.*not a readable parquet file"):
        read_rows(path)


def test_write_rows_refuses_unknown_suffix(tmp_path):
    with pytest.raises(ValueError, match="rows.txt.*unsupported type"):
        write_rows([make_row()], tmp_path / "rows.txt")
