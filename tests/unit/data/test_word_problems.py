"""The word-problem task of the SmolLM2 recipe: right answers, disjoint splits, the same files every time, and rows
that the loader and the built-in reward routing take as they are."""

from __future__ import annotations

import re

from hybridrl.data.preprocess import main as preprocess_main
from hybridrl.data.io import read_rows
from hybridrl.data.word_problems import WORD_PROBLEMS_DATA_SOURCE, WordProblems
from hybridrl.rewards import check_data_sources, default_compute_score

_STORY = re.compile(r"has (\d+) \w+ and (buys|finds|gets|wins|gives away|loses|sells|gives) (\d+)")


def test_answers_follow_the_story():
    for row in WordProblems().rows("train", 300):
        text = row["prompt"][0]["content"]
        first, verb, second = _STORY.search(text).groups()
        adds = verb in ("buys", "finds", "gets", "wins")
        expected = int(first) + int(second) if adds else int(first) - int(second)
        assert row["reward_model"]["ground_truth"] == str(expected) and expected >= 1, text
        assert text.endswith("Answer with just the number.")


def test_held_out_problems_never_appear_in_training_and_files_are_reproducible(tmp_path):
    task = WordProblems(seed=3)
    train = {row["prompt"][0]["content"] for row in task.rows("train", 3000)}
    val = [row["prompt"][0]["content"] for row in task.rows("val", 200)]
    assert len(set(val)) == 200 and not train & set(val)
    assert [row["prompt"][0]["content"] for row in WordProblems(seed=3).rows("val", 200)] == val
    assert preprocess_main(["word-problems", "--output", str(tmp_path), "--num-train", "64", "--num-val", "16"]) == 0
    rows = [source.row for source in read_rows(tmp_path / "val.parquet").rows]
    assert len(rows) == 16 and rows[0]["prompt"] == WordProblems().rows("val", 1)[0]["prompt"]


def test_rows_are_routed_to_the_gsm8k_style_scorer():
    check_data_sources([WORD_PROBLEMS_DATA_SOURCE])
    assert default_compute_score(WORD_PROBLEMS_DATA_SOURCE, "34 + 27 = 61", "61")["acc"] == 1.0
    assert default_compute_score(WORD_PROBLEMS_DATA_SOURCE, "34 - 27 = 7", "61")["acc"] == 0.0
