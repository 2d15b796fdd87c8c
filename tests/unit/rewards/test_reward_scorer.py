"""RewardScorer: parallel scoring in persistent workers; raising, hanging, crashing and NaN rewards score 0, counted."""

from __future__ import annotations

import time

import pytest

from hybridrl.rewards import RewardFunctionSource, RewardScorer
from hybridrl.rewards.worker_pool import WorkerStartError

FAULTY_REWARD = '''
import math, os, time

def compute_score(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "hang":
        time.sleep(600)
    if solution_str == "raise":
        raise RuntimeError("reward exploded")
    if solution_str == "nan":
        return math.nan
    if solution_str == "inf":
        return {"score": math.inf}
    if solution_str == "text":
        return "1.0"
    if solution_str == "nodict":
        return {"acc": 1.0}
    if solution_str == "die":
        os._exit(7)
    if solution_str == "exit":
        raise SystemExit(3)
    return {"score": float(solution_str == ground_truth), "pid": os.getpid(), "length": len(solution_str)}
'''

TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rewards") / "faulty_reward.py"
    path.write_text(FAULTY_REWARD)
    return path


@pytest.fixture(scope="module")
def scorer(reward_file):
    with RewardScorer(RewardFunctionSource(str(reward_file)), timeout_s=TIMEOUT_S, num_workers=2) as scorer:
        yield scorer


def _score(scorer, solutions, truth="a"):
    return scorer.score(["custom"] * len(solutions), solutions, [truth] * len(solutions))


@pytest.mark.timeout(60)  # a regression that lets a hanging reward block must fail here, not stall the suite
def test_failures_score_zero_are_counted_and_never_hang(scorer):
    solutions = ["a", "hang", "raise", "nan", "inf", "text", "nodict", "die", "exit", "b", "a"]
    start = time.monotonic()
    scores, info = _score(scorer, solutions)
    elapsed = time.monotonic() - start
    assert scores.tolist() == [1.0] + [0.0] * 9 + [1.0]
    assert info.statuses == ["ok", "timeout", "error", "invalid", "invalid", "invalid", "invalid", "crashed", "error",
                             "ok", "ok"]
    metrics = info.metrics()
    assert (metrics["reward/num_timeout"], metrics["reward/num_error"], metrics["reward/num_invalid"],
            metrics["reward/num_crashed"]) == (1.0, 2.0, 4.0, 1.0)
    assert info.num_failed == 8 and len(info.messages) == 8
    assert info.messages[0] == f"sample 1 (data_source='custom'): timeout: ran longer than the {TIMEOUT_S:g} s " \
                               "timeout; its worker was killed"
    assert "sample 2 (data_source='custom'): error: raised RuntimeError: reward exploded" in info.messages
    assert any(message.startswith("sample 7") and "exit code 7" in message for message in info.messages)
    assert elapsed < 20, f"a hanging reward held the scorer for {elapsed:.1f} s"
    # The pool recovered: the next batch is scored normally.
    scores, info = _score(scorer, ["a", "b", "a"])
    assert scores.tolist() == [1.0, 0.0, 1.0] and info.num_failed == 0


def test_pool_is_reused_across_calls(scorer):
    _score(scorer, ["a"] * 4)  # workers replaced after earlier kills have finished starting
    pids = scorer.worker_pids
    start = time.monotonic()
    scores, info = _score(scorer, ["a"] * 200)
    elapsed = time.monotonic() - start
    assert scores.sum().item() == 200.0
    assert scorer.worker_pids == pids  # no process was started for this batch
    assert set(info.extras["pid"]) <= set(pids)
    assert elapsed < 60, f"200 cheap samples took {elapsed:.2f} s"  # a hang guard; reuse is the pids check above


def test_extras_are_aligned_and_averaged(scorer):
    scores, info = _score(scorer, ["a", "raise", "abc"])
    assert info.extras["length"] == [1, None, 3]
    assert info.metrics()["reward/length"] == 2.0


def test_builtin_router_in_workers_and_in_process():
    sources = ["openai/gsm8k", "gsm8k", "math", "arithmetic", "arithmetic"]
    responses = ["so\n#### 1,080", "It is 72.", "$\\boxed{\\frac{1}{2}}$", "68", "69"]
    truths = ["1080", "72", "0.5", "68", "68"]
    for num_workers in (0, 2):
        with RewardScorer(timeout_s=30.0, num_workers=num_workers) as scorer:
            scores, info = scorer.score(sources, responses, truths, [{"index": i} for i in range(5)])
            assert scores.tolist() == [1.0, 0.5, 1.0, 1.0, 0.0]
            assert info.extras["acc"] == [1.0, 1.0, 1.0, 1.0, 0.0]
            with pytest.raises(ValueError, match="sample 1: no reward function for data_source='trivia'"):
                scorer.score(["arithmetic", "trivia"], ["1", "1"], ["1", "1"])


def test_in_process_mode_still_contains_errors_and_bad_values(reward_file):
    scorer = RewardScorer(RewardFunctionSource(str(reward_file)), num_workers=0)
    scores, info = _score(scorer, ["a", "raise", "nan", "exit"])
    assert scores.tolist() == [1.0, 0.0, 0.0, 0.0] and info.statuses == ["ok", "error", "invalid", "error"]
    assert scorer.worker_pids == []


def test_callables_lambdas_and_argument_checks():
    assert RewardScorer(lambda *args: 0.5, num_workers=0).score(["x"], ["y"], ["z"])[0].tolist() == [0.5]
    with pytest.raises(ValueError, match="cannot be sent to worker processes"):
        RewardScorer(lambda *args: 0.5, num_workers=1)
    scorer = RewardScorer(num_workers=0)
    with pytest.raises(ValueError, match=r"got lengths \{'data_sources': 2, 'solution_strs': 1"):
        scorer.score(["arithmetic", "arithmetic"], ["1"], ["1", "1"])
    with pytest.raises(TypeError, match=r"solution_strs\[0\] is a list"):
        scorer.score(["arithmetic"], [[1, 2]], ["1"])
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        RewardScorer(timeout_s=0)
    assert scorer.score([], [], [])[0].shape == (0,)


def test_worker_that_cannot_load_the_function_is_reported(tmp_path):
    path = tmp_path / "vanishing_reward.py"
    path.write_text("def compute_score(a, b, c, d):\n    return 1.0\n")
    scorer = RewardScorer(RewardFunctionSource(str(path)), num_workers=1)  # the parent loads it here
    path.unlink()  # ... and the worker will not find it
    with pytest.raises(WorkerStartError, match="could not load the reward function: ValueError: "
                                               "custom_reward_function.path="):
        scorer.score(["x"], ["y"], ["z"])
    path.write_text("def compute_score(a, b, c, d):\n    return 2.0\n")
    assert scorer.score(["x"], ["y"], ["z"])[0].tolist() == [2.0]  # the pool restarts after a failure
    scorer.close()
    assert scorer.worker_pids == []


def test_worker_modules_do_not_import_torch():
    """Workers import the reward package, not torch: a worker (re)start stays a fraction of a second."""
    import subprocess
    import sys

    code = "import sys, hybridrl.rewards.worker_pool; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_a_subsets_score_info_lands_at_its_rows_positions():
    """``ScoreInfo.scattered``: statuses, extras and the messages' sample numbers of a subset (the rows an agent left
    to the reward function) at their places in the whole batch."""
    from hybridrl.rewards.scorer import ScoreInfo

    subset = ScoreInfo(["ok", "error"], ["sample 1 (data_source='s'): error: boom"], {"acc": [True, None]})
    whole = subset.scattered([2, 5], 6)
    assert whole.statuses == ["ok", "ok", "ok", "ok", "ok", "error"]
    assert whole.extras == {"acc": [None, None, True, None, None, None]}
    assert whole.messages == ["sample 5 (data_source='s'): error: boom"] and whole.num_failed == 1
