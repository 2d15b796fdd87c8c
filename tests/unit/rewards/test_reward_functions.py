"""Built-in reward functions against hand-written cases, and routing by data_source."""

from __future__ import annotations

from decimal import Decimal

import pytest

from hybridrl.rewards import REWARD_FUNCTIONS, check_data_sources, default_compute_score
from hybridrl.rewards import arithmetic, gsm8k, math_reward
from hybridrl.rewards.numeric import find_numbers, numbers_equal, parse_number


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1080", Decimal(1080)), ("1,080", Decimal(1080)), (" $1,080. ", Decimal(1080)), ("-3", Decimal(-3)),
     ("2.50", Decimal("2.5")), (7, Decimal(7)), (0.5, Decimal("0.5")), ("1,0,8", None), ("68 apples", None),
     ("", None), (float("nan"), None), (True, None), (None, None)],
)
def test_parse_number(text, expected):
    assert parse_number(text) == expected


def test_find_numbers_reads_minus_after_a_digit_as_subtraction():
    assert find_numbers("5-3 = 2, then -4 and 1,234.5") == ["5", "3", "2", "-4", "1,234.5"]
    assert numbers_equal("1,080", 1080.0) and not numbers_equal("1080", "1081") and not numbers_equal("x", "x")


@pytest.mark.parametrize(
    ("response", "truth", "score", "acc", "format_ok"),
    [
        ("She earns 9 * 120 = 1080 dollars.\n#### 1,080", "1080", 1.0, 1.0, 1.0),
        ("#### 1080", "1,080", 1.0, 1.0, 1.0),
        ("#### $1,080.00", "1080", 1.0, 1.0, 1.0),
        ("#### 12\nWait, that is wrong.\n#### 1080", "1080", 1.0, 1.0, 1.0),  # the last marker counts
        ("#### -3", "-3", 1.0, 1.0, 1.0),
        ("The total is 1080.\n#### 1081", "1080", 0.0, 0.0, 1.0),  # marker answer wrong: no fallback
        ("The answer is 72.", "72", 0.5, 1.0, 0.0),  # fallback: last number, unformatted
        ("48 clips in April, 24 in May, 72 in all", "72", 0.5, 1.0, 0.0),
        ("48 clips in April and 24 in May", "72", 0.0, 0.0, 0.0),
        ("I do not know.", "72", 0.0, 0.0, 0.0),
        ("####", "72", 0.0, 0.0, 0.0),
    ],
)
def test_gsm8k_hand_cases(response, truth, score, acc, format_ok):
    result = gsm8k.compute_score("openai/gsm8k", response, truth)
    assert (result["score"], result["acc"], result["format_ok"]) == (score, acc, format_ok)


def test_gsm8k_format_score_and_prediction():
    result = gsm8k.compute_score("gsm8k", "#### 5", "6", None, format_score=0.1)
    assert result["score"] == 0.1 and result["pred"] == "5"
    assert gsm8k.compute_score("gsm8k", "no number", "6")["pred"] == ""
    with pytest.raises(ValueError, match="gsm8k ground_truth 'seventy' is not a number"):
        gsm8k.compute_score("gsm8k", "#### 70", "seventy")


@pytest.mark.parametrize(
    ("response", "score"),
    [("68", 1.0), (" 68\n", 1.0), ("068", 1.0), ("68.0", 1.0), ("68 apples", 0.0), ("6868", 0.0), ("= 68", 0.0),
     ("", 0.0), ("67", 0.0), ("68.", 0.0), ("$68", 0.0)],
)
def test_arithmetic_exact_numeric_match(response, score):
    assert arithmetic.compute_score("arithmetic", response, "68")["score"] == score


def test_arithmetic_negative_and_bad_truth():
    assert arithmetic.compute_score("arithmetic", "-22", "-22")["acc"] == 1.0
    with pytest.raises(ValueError, match="arithmetic ground_truth 'x' is not a number"):
        arithmetic.compute_score("arithmetic", "1", "x")


@pytest.mark.parametrize(
    ("response", "truth", "score"),
    [("So the answer is $\\boxed{\\dfrac{1}{2}}$.", "0.5", 1.0),
     ("The answer is $\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}", 1.0),
     ("Thus $x = \\boxed{x^2+1}$", "\\boxed{x^2+1}", 1.0),
     ("The answer is $\\boxed{3}$", "\\frac{1}{2}", 0.0),
     ("I give up.", "\\frac{1}{2}", 0.0)],
)
def test_math_verify_cases(response, truth, score):
    assert math_reward.compute_score("math", response, truth)["score"] == score


def test_math_unparseable_truth_is_a_data_error():
    with pytest.raises(ValueError, match="could not be parsed"):
        math_reward.compute_score("math", "\\boxed{1}", "\\boxed{}")


def test_routing_by_data_source():
    assert {"openai/gsm8k", "gsm8k", "math", "lighteval/MATH", "arithmetic"} <= set(REWARD_FUNCTIONS.names())
    assert default_compute_score("openai/gsm8k", "#### 7", "7", None)["score"] == 1.0
    assert default_compute_score("arithmetic", "7", "7", None)["score"] == 1.0
    assert default_compute_score("HuggingFaceH4/MATH-500", "$\\boxed{7}$", "7", None)["score"] == 1.0
    with pytest.raises(ValueError, match="unknown reward function .* 'trivia'; valid names: openai/gsm8k"):
        default_compute_score("trivia", "7", "7", None)


def test_check_data_sources_names_the_sample():
    check_data_sources(["gsm8k", "arithmetic"])
    with pytest.raises(ValueError, match="sample 2: no reward function for data_source='trivia'"):
        check_data_sources(["gsm8k", "math", "trivia"])
