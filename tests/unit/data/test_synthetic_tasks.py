"""The synthetic arithmetic task: determinism, correct answers, train/val disjointness, schema, tokenizer coverage."""

from __future__ import annotations

import itertools

import pytest

from hybridrl.data import SYNTHETIC_TASKS, ArithmeticTask, build_synthetic_task, record_from_row
from hybridrl.data.synthetic import carry_less_sum
from hybridrl.rewards import default_compute_score
from hybridrl.utils.tiny_model import DEFAULT_CHARACTERS


def _evaluate(expression: str) -> int:
    """Slow, obvious evaluation of ``a<op>b`` (the generator must agree with it)."""
    for position in range(1, len(expression)):
        if expression[position] in "+-*/":
            left, operator, right = int(expression[:position]), expression[position], int(expression[position + 1:])
            break
    else:
        raise AssertionError(f"no operator in {expression!r}")
    if operator == "/":
        assert left % right == 0, f"{expression} is not exact"
        return left // right
    return {"+": left + right, "-": left - right, "*": left * right}[operator]


def _expressions(rows) -> list[str]:
    return [row["extra_info"]["expression"] for row in rows]


def test_registry_and_builder():
    assert "arithmetic" in SYNTHETIC_TASKS.names()
    task = build_synthetic_task("arithmetic", seed=5, num_train=10)
    assert isinstance(task, ArithmeticTask) and task.seed == 5 and len(task.train_rows()) == 10
    with pytest.raises(ValueError, match="data.synthetic_task='nope' is unknown"):
        build_synthetic_task("nope")


def test_generation_is_deterministic_in_the_seed():
    first, again, other = ArithmeticTask(seed=1), ArithmeticTask(seed=1), ArithmeticTask(seed=2)
    assert first.train_rows(200) == again.train_rows(200)
    assert _expressions(first.train_rows(200)) != _expressions(other.train_rows(200))
    assert first.validation_rows() == other.validation_rows()  # the held-out set does not depend on the seed


def test_stream_is_random_access_and_infinite():
    task = ArithmeticTask(seed=4)
    assert list(itertools.islice(task.iter_train_rows(start=1000), 3)) == task.train_rows(3, start=1000)
    assert task.train_row(123_456)["extra_info"]["index"] == 123_456


@pytest.mark.parametrize("operators", ["+-", "*", "/", "+-*/"])
def test_answers_are_correct_and_operands_in_range(operators):
    task = ArithmeticTask(seed=3, operators=operators, min_digits=1, max_digits=2)
    for row in task.train_rows(300) + task.validation_rows()[:50]:
        expression = row["extra_info"]["expression"]
        assert row["prompt"] == [{"role": "user", "content": f"{expression}="}]
        assert row["reward_model"]["ground_truth"] == str(_evaluate(expression))
        assert int(row["reward_model"]["ground_truth"]) >= 0  # allow_negative=False
        if "/" not in expression:  # a dividend is divisor × quotient and may have more digits
            assert all(len(part) <= 2 for part in expression.replace("*", "+").replace("-", "+").split("+"))


def test_negative_answers_only_when_allowed():
    rows = ArithmeticTask(seed=1, operators="-", allow_negative=True).train_rows(200)
    assert any(row["reward_model"]["ground_truth"].startswith("-") for row in rows)


def test_train_and_validation_are_disjoint():
    task = ArithmeticTask(seed=9)
    validation = set(_expressions(task.validation_rows()))
    assert len(validation) == task.num_val  # distinct problems
    train = _expressions(task.train_rows(20_000))
    assert validation.isdisjoint(train)
    assert not any(task.is_held_out(expression) for expression in train)
    assert all(task.is_held_out(expression) for expression in validation)


def test_rows_use_the_file_schema_and_the_arithmetic_reward():
    task = ArithmeticTask(seed=2)
    for index, row in enumerate(task.train_rows(50)):
        record = record_from_row(row, f"arithmetic: row {index}")
        assert record.data_source == "arithmetic" and row["reward_model"]["style"] == "rule"
        assert default_compute_score(record.data_source, record.ground_truth, record.ground_truth, None)["score"] == 1.0
        wrong = str(int(record.ground_truth) + 1)
        assert default_compute_score(record.data_source, wrong, record.ground_truth, None)["score"] == 0.0


def test_prompts_are_short_and_in_the_char_tokenizer_vocabulary(char_tokenizer):
    task = ArithmeticTask(seed=1, operators="+-*/", max_digits=3)
    rows = task.train_rows(300) + task.validation_rows()
    for row in rows:
        content = row["prompt"][0]["content"]
        answer = row["reward_model"]["ground_truth"]
        assert len(content) <= 12 and set(content + answer) <= set(DEFAULT_CHARACTERS)
        ids = char_tokenizer(content, add_special_tokens=False)["input_ids"]
        assert char_tokenizer.decode(ids) == content and len(ids) == len(content)


def test_too_small_problem_space_for_num_val_is_a_clear_error():
    task = ArithmeticTask(max_digits=1, operators="+", num_val=50)  # 100 problems, ~10 held out
    with pytest.raises(ValueError, match="distinct held-out problems found, num_val=50 asked"):
        task.validation_rows()


@pytest.mark.parametrize(("options", "key"), [({"min_digits": 3, "max_digits": 2}, "max_digits"),
                                              ({"operators": "+%"}, "operators"),
                                              ({"val_fraction": 1.0}, "val_fraction"),
                                              ({"num_val": 0}, "num_val"),
                                              ({"sft_drop_carry_rate": 1.5}, "sft_drop_carry_rate")])
def test_invalid_task_options_name_the_option(options, key):
    with pytest.raises(ValueError, match=key):
        ArithmeticTask(**options)


def _slow_carry_less_sum(first: int, second: int) -> int:
    """Reference: pad both to the same width as strings and add column by column, mod 10."""
    width = max(len(str(first)), len(str(second)))
    columns = zip(str(first).zfill(width), str(second).zfill(width))
    return int("".join(str((int(x) + int(y)) % 10) for x, y in columns))


def test_carry_less_sum_matches_column_by_column_reference():
    for first, second in itertools.product(range(0, 1200, 7), range(0, 130, 3)):
        assert carry_less_sum(first, second) == _slow_carry_less_sum(first, second), (first, second)
    assert carry_less_sum(58, 7) == 55 and carry_less_sum(95, 17) == 2 and carry_less_sum(12, 34) == 46


def test_sloppy_sft_demonstrations_drop_the_carry_at_the_configured_rate():
    options = dict(operators="+", max_first_operand=99, max_second_operand=9, val_fraction=0.2)
    clean = ArithmeticTask(**options).sft_examples(4000)
    sloppy = ArithmeticTask(**options, sft_drop_carry_rate=0.5).sft_examples(4000)
    assert [example.prompt for example in clean] == [example.prompt for example in sloppy]
    dropped = carrying = 0
    for exact, noisy in zip(clean, sloppy):
        first, second = (int(x) for x in exact.prompt[0]["content"].rstrip("=").split("+"))
        assert exact.response == str(first + second)
        if carry_less_sum(first, second) == first + second:      # no carry: nothing for the annotator to forget
            assert noisy.response == exact.response
            continue
        carrying += 1
        assert noisy.response in (exact.response, str(carry_less_sum(first, second)))
        dropped += noisy.response != exact.response
    assert carrying > 1000 and abs(dropped / carrying - 0.5) < 0.05     # ~4.5σ band for a Bernoulli(0.5) share
    assert ArithmeticTask(**options, sft_drop_carry_rate=0.5).sft_examples(200) == sloppy[:200]   # deterministic


def test_sloppy_annotation_never_touches_the_rl_stream_or_the_held_out_set():
    options = dict(operators="+", max_first_operand=99, max_second_operand=9, val_fraction=0.2, num_val=100)
    clean, sloppy = ArithmeticTask(**options), ArithmeticTask(**options, sft_drop_carry_rate=1.0)
    assert clean.train_rows(300) == sloppy.train_rows(300)
    assert clean.validation_rows() == sloppy.validation_rows()
