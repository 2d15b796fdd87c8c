"""verl's data sources routed to our scorers (DAPO, AIME, NuminaMath, MATH, Search-R1), on realistic outputs; the
keyword switches (``custom_reward_function.reward_kwargs``); and math-verify's LaTeX parser with the right ANTLR."""

from __future__ import annotations

import importlib.metadata

import pytest

from hybridrl.rewards import RewardFunctionSource, check_data_sources, default_compute_score
from hybridrl.rewards import gsm8k, math_dapo, math_reward, qa_exact_match
from hybridrl.rewards.registry import check_reward_kwargs, reward_function_for

DAPO_TAIL = ("Let me compute: the sum of the roots is 5 and the product 6, so the requested value is "
             "5^2 - 2*6 = 13.\n\n")


@pytest.mark.parametrize(
    ("response", "truth", "score", "pred"),
    [
        (DAPO_TAIL + "Answer: 13", "13", 1.0, "13"),
        (DAPO_TAIL + "Answer: $13$", "13", 1.0, "13"),
        (DAPO_TAIL + "**Answer: \\boxed{13}.**", "13", 1.0, "13"),  # bold and boxed, with a full stop
        (DAPO_TAIL + "answer: 1,080.00", "1080", 1.0, "1,080.00"),
        ("Answer: 12\nHmm, I made an error: 13 is right.\nAnswer: 13", "13", 1.0, "13"),  # the last line counts
        (DAPO_TAIL + "Answer: \\frac{1}{2}", "0.5", 1.0, "\\frac{1}{2}"),
        (DAPO_TAIL + "Answer: ½", "\\frac{1}{2}", 1.0, "½"),
        (DAPO_TAIL + "Answer: 14", "13", -1.0, "14"),
        (DAPO_TAIL + "The answer is 13.", "13", -1.0, ""),  # no Answer: line: the format is the task
        ("", "13", -1.0, ""),
    ],
)
def test_math_dapo_scores_the_answer_line_plus_or_minus_one(response, truth, score, pred):
    result = math_dapo.compute_score("math_dapo", response, truth)
    assert (result["score"], result["pred"]) == (score, pred)
    assert result["acc"] == float(score > 0) and result["format_ok"] == float(bool(pred))


def test_aime_sources_of_any_year_route_to_the_dapo_scorer():
    for source in ("aime24", "aime-2025", "aime_2024_repeated_8", "math_dapo", "math_dapo_reasoning"):
        assert reward_function_for(source) is math_dapo.compute_score, source
        assert default_compute_score(source, "Answer: 204", "204")["score"] == 1.0
    check_data_sources(["aime2025", "math_dapo"])


@pytest.mark.parametrize(
    "source", ["numina_aops_forum", "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc",
               "numina_cn_k12", "numina_olympiads", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval",
               "HuggingFaceH4/MATH-500"])
def test_numina_and_math_sources_score_the_boxed_answer(source):
    response = "Adding the two cases gives $\\frac{6}{8}$, i.e. $\\boxed{\\dfrac{3}{4}}$."
    assert default_compute_score(source, response, "\\frac{3}{4}")["score"] == 1.0
    assert default_compute_score(source, "So $\\boxed{\\frac{2}{3}}$.", "\\frac{3}{4}")["score"] == 0.0


@pytest.mark.parametrize(
    ("response", "truth"),
    [("The discount is $\\boxed{10\\%}$.", "10"),  # fails with antlr4-python3-runtime 4.9.3 (latex2sympy2's stale parser)
     ("Therefore the slope is $\\boxed{-0.75}$.", "\\frac{-3}{4}"),
     ("The probability is $\\boxed{\\frac14}$", "0.25"),
     ("The probability is ¼.", "0.25"),
     ("She needs 1½ cups.", "\\frac{3}{2}")],
)
def test_math_verify_reads_percent_fractions_and_unicode_fractions(response, truth):
    assert math_reward.compute_score("math", response, truth)["score"] == 1.0, (
        f"math-verify scored {response!r} wrong against {truth!r}; antlr4-python3-runtime is "
        f"{importlib.metadata.version('antlr4-python3-runtime')} (math-verify's LaTeX parser needs 4.13)")


def test_the_antlr_runtime_is_the_one_math_verifys_parser_was_generated_for():
    import sympy
    from latex2sympy2_extended import latex2sympy

    assert importlib.metadata.version("antlr4-python3-runtime").startswith("4.13")
    assert sympy.simplify(latex2sympy("10\\%")) == sympy.Rational(1, 10)  # 4.9.3: AttributeError … 'FUNC_GAMMA'


@pytest.mark.parametrize(
    ("response", "truth", "score"),
    [("<think>The tower in Paris…</think>\n<answer> The Eiffel Tower. </answer>", {"target": ["Eiffel Tower"]}, 1.0),
     ("<answer>Paris</answer> no wait <answer>Lyon</answer>", ["Lyon", "Lyons"], 1.0),  # the last answer counts
     ("<answer>an apple</answer>", "Apple", 1.0),
     ("<answer>Rome</answer>", {"target": ["Paris"]}, 0.0),
     ("Paris", {"target": ["Paris"]}, 0.0)],  # no <answer> tag
)
def test_search_r1_exact_match(response, truth, score):
    assert default_compute_score("searchR1_nq", response, truth)["score"] == score


def test_qa_format_score_and_bad_truth():
    assert qa_exact_match.compute_score("searchR1_nq", "<answer>Rome</answer>", "Paris", format_score=0.1)["score"] == 0.1
    with pytest.raises(ValueError, match="no 'target'"):
        qa_exact_match.compute_score("searchR1_nq", "<answer>x</answer>", {"answers": ["x"]})


def test_gsm8k_partial_credit_is_a_keyword_switch():
    unformatted_right = "48 in April and 24 in May: 72 clips."
    assert default_compute_score("openai/gsm8k", unformatted_right, "72")["score"] == gsm8k.UNFORMATTED_CORRECT_SCORE
    strict = RewardFunctionSource(reward_kwargs={"unformatted_correct_score": 0.0}).load()
    assert strict("openai/gsm8k", unformatted_right, "72", None)["score"] == 0.0
    assert strict("openai/gsm8k", "#### 72", "72", None)["score"] == 1.0
    # a keyword goes only to the functions that declare it: the DAPO scorer ignores gsm8k's
    assert strict("math_dapo", "Answer: 7", "8", None)["score"] == -1.0


def test_reward_kwargs_no_builtin_takes_are_refused_with_what_they_take():
    check_reward_kwargs({"incorrect_score": 0.0, "format_score": 0.1})
    with pytest.raises(ValueError, match=r"no built-in reward function takes \['unformatted_score'\].*gsm8k: "
                                         r"correct_score, unformatted_correct_score"):
        RewardFunctionSource(reward_kwargs={"unformatted_score": 0}).load()


def test_a_custom_function_gets_its_reward_kwargs_and_refuses_others(tmp_path):
    path = tmp_path / "reward.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info, *, bonus=0.0):\n"
                    "    return float(solution_str == ground_truth) + bonus\n")
    assert RewardFunctionSource(str(path), reward_kwargs={"bonus": 0.5}).load()("x", "a", "a", None) == 1.5
    with pytest.raises(ValueError, match=r"reward_kwargs=\{'malus': 1\}.*does not take them"):
        RewardFunctionSource(str(path), reward_kwargs={"malus": 1}).load()
