"""Loading custom_reward_function.path/name: the happy path and every mistake named by key, path and name."""

from __future__ import annotations

import pytest

from hybridrl.rewards import RewardFunctionSource, RewardScorer, load_custom_reward_fn


def _write(folder, text, name="my_reward.py"):
    path = folder / name
    path.write_text(text)
    return path


def test_loads_the_named_function_with_any_parameter_names(tmp_path):
    path = _write(tmp_path, "from dataclasses import dataclass\n\n@dataclass\nclass Cfg:\n    bonus: float = 0.5\n\n"
                            "def score_it(source, text, truth, info):\n    return float(text == truth) + Cfg().bonus\n")
    function = load_custom_reward_fn(path, "score_it")
    assert function("x", "a", "a", {}) == 1.5 and function("x", "a", "b", None) == 0.5


def test_same_file_name_in_two_folders_gives_two_functions(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _write(tmp_path / "a", "def compute_score(*a):\n    return 1\n")
    second = _write(tmp_path / "b", "def compute_score(*a):\n    return 2\n")
    assert load_custom_reward_fn(first)("s", "x", "y", {}) == 1
    assert load_custom_reward_fn(second)("s", "x", "y", {}) == 2


def test_missing_path_names_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"custom_reward_function.path='.*nowhere.py' does not exist"):
        load_custom_reward_fn(tmp_path / "nowhere.py")


def test_non_python_file_is_refused(tmp_path):
    path = _write(tmp_path, "def compute_score(*a): return 1\n", name="reward.txt")
    with pytest.raises(ValueError, match=r"custom_reward_function.path='.*reward.txt' must be a .py file"):
        load_custom_reward_fn(path)


def test_undefined_name_lists_what_is_there(tmp_path):
    path = _write(tmp_path, "def helper(a, b, c, d):\n    return 0\n")
    with pytest.raises(ValueError, match=r"custom_reward_function.name='compute_score' is not defined in "
                                         r"'.*my_reward.py'; callables defined there: \['helper'\]"):
        load_custom_reward_fn(path)


def test_non_callable_name_is_refused(tmp_path):
    path = _write(tmp_path, "compute_score = 0.5\n")
    with pytest.raises(ValueError, match=r"custom_reward_function.name='compute_score' in '.*my_reward.py' is a "
                                         r"float, not callable"):
        load_custom_reward_fn(path)


def test_wrong_signature_is_refused(tmp_path):
    path = _write(tmp_path, "def compute_score(solution, truth):\n    return 1.0\n")
    with pytest.raises(ValueError, match=r"must accept 4 positional arguments .*signature is \(solution, truth\)"):
        load_custom_reward_fn(path)


@pytest.mark.parametrize("body", ["def compute_score(:\n", "raise RuntimeError('no GPU here')\n",
                                  "import sys\nsys.exit(3)\n"])
def test_import_failure_names_the_path(tmp_path, body):
    path = _write(tmp_path, body)
    with pytest.raises(ValueError, match=r"custom_reward_function.path='.*my_reward.py': importing it failed"):
        load_custom_reward_fn(path)


def test_scorer_fails_fast_on_a_bad_source_before_starting_workers(tmp_path):
    path = _write(tmp_path, "def other(a, b, c, d):\n    return 0\n")
    with pytest.raises(ValueError, match="custom_reward_function.name='compute_score' is not defined"):
        RewardScorer(RewardFunctionSource(str(path)), num_workers=2)


def test_scorer_from_config(tmp_path):
    from hybridrl.config.schema import CustomRewardConfig

    path = _write(tmp_path, "def mine(a, b, c, d):\n    return 0.25\n")
    scorer = RewardScorer.from_config(CustomRewardConfig(path=str(path), name="mine", timeout_s=3.0), num_workers=0)
    scores, info = scorer.score(["any"], ["text"], ["truth"])
    assert scores.tolist() == [0.25] and info.statuses == ["ok"] and scorer.timeout_s == 3.0
    builtin = RewardScorer.from_config(CustomRewardConfig(), num_workers=0)
    assert builtin.score(["arithmetic"], ["4"], ["4"])[0].tolist() == [1.0]
