"""An LLM judge's score as the reward: a judge hybridrl serves for the run (``hybridrl serve`` in its own process,
vLLM's CPU build), and GRPO on 2 CPU ranks whose only reward is a judge's verdict."""

from __future__ import annotations

import pytest

from hybridrl.config import load_config
from hybridrl.rewards.judge import JudgeQuery
from hybridrl.rewards.judge_server import open_judge
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.utils.tracking import read_metrics
from scripted_judge import scripted  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

LENGTH_SCORE = "def score(reply):\n    return float(len(reply))\n"


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("judge") / "tiny-judge")


@pytest.mark.long  # a third vLLM engine: 112 s inside the parallel suite; the notebook test serves a judge too
def test_a_judge_served_for_the_run_replies_greedily_and_stops_with_the_client(judge_dir, tmp_path):
    pytest.importorskip("vllm", reason="needs vLLM (pip install 'hybridrl[cpu]')")
    (tmp_path / "scoring.py").write_text(LENGTH_SCORE)
    config = load_config(["reward_judge.enable=true", f"reward_judge.model_path={judge_dir}",
                          f"reward_judge.score_fn={tmp_path / 'scoring.py'}:score", "reward_judge.max_tokens=6",
                          "reward_judge.serve_dtype=float32", "reward_judge.serve_max_model_len=128",
                          "reward_judge.template='{prompt}{response}'"], check_paths=False)
    client = open_judge(config.reward_judge)
    server = client.closers[0].__self__
    try:
        assert client.model == "judge" and server.base_url.endswith("/v1")
        queries = [JudgeQuery("1+2=", str(answer)) for answer in range(6)]
        first, second = client.score(queries), client.score(queries)
    finally:
        client.close()
    assert first.statuses == ["ok"] * 6 and first.replies == second.replies  # greedy: the same replies twice
    assert first.scores.tolist() == [float(len(reply)) for reply in first.replies]
    assert any(first.replies) and server.process.poll() is not None  # the judge's server stopped with the client


@pytest.mark.distributed
def test_grpo_whose_only_reward_is_a_judges_verdict(scripted, tmp_path):
    """The scripted judge pays 1 for an even last digit: the fused reward is the judge's alone (rule weight 0),
    and validation reports the judge's held-out score beside the rule's accuracy."""
    policy = save_tiny_model(tmp_path / "policy")
    judge = scripted(lambda text: "Score: 1" if text[-1:] in "02468" and text[-1:] else "Score: 0")
    config = load_config([
        f"model.path={policy}", "model.dtype=float32", f"trainer.default_local_dir={tmp_path / 'run'}",
        "rollout=hf", "trainer.total_training_steps=2", "trainer.logger=[jsonl]", "trainer.save_at_end=false",
        "trainer.test_freq=2", "trainer.ray.num_cpus=4",
        "data.synthetic_task_kwargs={max_digits: 1, operators: '+', num_val: 8}", "data.train_batch_size=4",
        "rollout.n=2", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size_per_gpu=2",
        "data.max_response_length=3", "reward_judge.enable=true", f"reward_judge.base_url={judge.base_url}",
        "reward_judge.template='{response}'", "reward_fusion.rule_weight=0.0", "reward_fusion.judge_weight=1.0"])
    from hybridrl.trainers.rl_trainer import RLTrainer

    result = RLTrainer(config).fit()
    assert result.global_step == 2
    rows = read_metrics(tmp_path / "run")
    for row in (row for row in rows if "critic/score/mean" in row):
        assert row["critic/score/mean"] == pytest.approx(row["reward/judge/mean"], abs=1e-6)
        assert row["reward/judge/num_parse_failure"] == 0.0 and "reward/rule/mean" in row
    assert 0.0 <= result.last_validation["val/judge/score"] <= 1.0 and "val/accuracy" in result.last_validation
    assert len(judge.requests) >= 2 * 4 * 2 + 2 * 8  # every training response, and the held-out set twice
