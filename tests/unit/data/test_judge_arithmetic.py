"""``arithmetic_judge``: candidate answers to judge, their verdicts, the SFT replies, and the verdict reward."""

from __future__ import annotations

import pytest

from hybridrl.data import build_synthetic_task
from hybridrl.data.synthetic import carry_less_sum
from hybridrl.rewards.registry import default_compute_score

OPTIONS = {"operators": "+", "max_first_operand": 99, "max_second_operand": 9, "val_fraction": 0.2, "num_val": 200}


def parsed(row):
    candidate, problem = row["prompt"][0]["content"].split("?")
    first, second = (int(value) for value in problem.rstrip("=").split("+"))
    return int(candidate), first + second, (first, second)


def test_verdicts_say_whether_the_candidate_is_the_answer_and_wrong_ones_are_plausible():
    task = build_synthetic_task("arithmetic_judge", **OPTIONS)
    rows = task.train_rows(400)
    wrong = 0
    for row in rows:
        candidate, answer, operands = parsed(row)
        verdict = row["reward_model"]["ground_truth"]
        assert verdict == ("1" if candidate == answer else "0") and row["data_source"] == "arithmetic_judge"
        assert row["extra_info"]["answer"] == f"{answer}:{verdict}"  # the SFT target: own answer, then verdict
        if verdict == "0":
            wrong += 1
            assert abs(candidate - answer) in (1, 10) or candidate == carry_less_sum(*operands)
    assert 150 < wrong < 250  # wrong_fraction 0.5
    assert [example.response for example in task.sft_examples(3)] == [row["extra_info"]["answer"] for row in rows[:3]]
    held_out = {row["extra_info"]["expression"] for row in task.validation_rows()}
    assert held_out == {row["extra_info"]["expression"]
                        for row in build_synthetic_task("arithmetic", **OPTIONS).validation_rows()}
    assert not held_out & {row["extra_info"]["expression"] for row in rows}


@pytest.mark.parametrize("reply, truth, score", [("65:0", "0", 1.0), ("65:1", "0", 0.0), (" 7:1\n", "1", 1.0),
                                                 ("65", "0", 0.0), ("", "1", 0.0)])
def test_the_verdict_after_the_last_colon_is_scored(reply, truth, score):
    result = default_compute_score("arithmetic_judge", reply, truth, {})
    assert result["score"] == score and result["acc"] == score


def test_wrong_fraction_outside_the_open_unit_interval_is_refused():
    with pytest.raises(ValueError, match="wrong_fraction must be in"):
        build_synthetic_task("arithmetic_judge", wrong_fraction=1.0)
