"""SFT batches per step (the SFT trainer's and PPO-ptx's): files cycled in order, or a synthetic task's stream."""

from __future__ import annotations

import pytest
from data_helpers import make_row

from hybridrl.data import ArithmeticTask, write_rows
from hybridrl.data.sft_source import build_sft_source


def test_synthetic_source_walks_the_task_stream_step_by_step():
    source = build_sft_source([], "arithmetic", {"max_digits": 1}, seed=3)
    whole = ArithmeticTask(seed=3, max_digits=1).sft_examples(12)  # the stream's first 12 examples, in one go
    assert source.take(0, 4) + source.take(1, 4) + source.take(2, 4) == whole
    assert source.take(2, 4) == whole[8:]  # random access: no state to resume


def test_file_source_cycles_rows_in_order(tmp_path):
    path = tmp_path / "sft.jsonl"
    write_rows([make_row(f"{i}+1=", str(i + 1)) for i in range(5)], path)
    source = build_sft_source([str(path)])
    taken = [example.response for step in range(3) for example in source.take(step, 3)]
    assert taken == [str(i % 5 + 1) for i in range(9)]


def test_source_needs_data(tmp_path):
    bad = write_rows([{"prompt": "1+1="}], tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match="bad.jsonl.*not an SFT row"):
        build_sft_source([str(bad)])
    with pytest.raises(ValueError, match="no SFT data"):
        build_sft_source([])
    with pytest.raises(ValueError, match="unknown"):
        build_sft_source([], "nope")
