"""Users' agents trained by the RL trainer (``rollout.multi_turn.agent``): plain ``openai`` client code in a file,
two GRPO steps on a tensor-parallel (t_g = 2) colocated vLLM CPU replica. Every call of every episode is made once —
by the replica's leader, whatever the tensor-parallel size — and the rows trained are the episodes' two-turn
conversations; the agent's reward and the reward function's score (where the agent returns ``None``) both reach
the step's scores; a fixed seed gives the same run twice. An OpenAI Agents SDK agent with a function tool trains
the same way."""

from __future__ import annotations

import math

import pytest

from hybridrl.config import load_config
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.long]

AGENT = '''
import os

async def agent(row, client):
    """Two turns: the model answers, is asked to check, answers again; odd rows score themselves."""
    messages = list(row["prompt"])
    for turn in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
        with open({log!r}, "a") as log:
            log.write(f"{{os.getpid()}} {{row['extra_info'].get('split')}}\\n")
        messages += [reply.choices[0].message.model_dump(exclude_none=True),
                     {{"role": "user", "content": "check"}}]
    answer = reply.choices[0].message.content or ""
    return None if int(row["extra_info"].get("index", 0)) % 2 == 0 else -1.0 - len(answer)
'''
STEPS, PROMPTS, N = 2, 4, 2


@pytest.fixture(scope="module")
def agent_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("agent_training")
    model = save_tiny_model(root / "model", tool_chat=True)
    log = root / "calls.log"
    (root / "my_agent.py").write_text(AGENT.format(log=str(log)))
    return model, root / "my_agent.py", log


def run(model, agent_file, run_dir, *extra):
    trainer = RLTrainer(load_config([
        f"model.path={model}", "model.dtype=float32", f"trainer.default_local_dir={run_dir}",
        f"trainer.total_training_steps={STEPS}", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.ray.num_cpus=4", "trainer.n_gpus_per_node=2", "rollout=vllm_cpu",
        "rollout.tensor_model_parallel_size=2", "algorithm.adv_estimator=grpo",
        "data.synthetic_task_kwargs={max_digits: 1, operators: '+', num_val: 4}", f"data.train_batch_size={PROMPTS}",
        f"rollout.n={N}", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size_per_gpu=2",
        "data.max_prompt_length=32", "data.max_response_length=48", "actor.optim.lr=1e-2",
        "rollout.multi_turn.enable=true", f"rollout.multi_turn.agent={agent_file}:agent", *extra]))
    trainer.fit()
    return trainer


def test_an_agent_trains_two_steps_each_call_made_once(agent_setup, tmp_path):
    model, agent_file, log = agent_setup
    run(model, agent_file, tmp_path / "first")
    calls = [line.split() for line in log.read_text().splitlines()]
    # two calls per training episode, once each: not once per TP rank (the run's last validation has its own)
    assert sum(split == "train" for _, split in calls) == STEPS * PROMPTS * N * 2
    assert len({pid for pid, _ in calls}) == 1  # the replica's leader
    rows = read_metrics(tmp_path / "first")
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["agent/turns"] == 2.0 and row["agent/env_failures"] == 0.0 and row["agent/split_sequences"] == 0
        assert row["agent/observation_tokens"] > 0
        assert row["critic/score/min"] < 0  # an agent's own reward (minus its answer's length) reached the scores
    log.unlink()
    run(model, agent_file, tmp_path / "second")
    again = read_metrics(tmp_path / "second")
    for first, second in zip(rows, again):
        for key in ("critic/score/mean", "actor/pg_loss", "response_length/mean"):
            assert first[key] == second[key], key


SDK_AGENT = """
from agents import Agent, function_tool

from hybridrl.gateway.adapters import openai_agents_sdk


@function_tool
def calculator(expression: str) -> str:
    \"\"\"Evaluate a sum.\"\"\"
    left, right = expression.split("+")
    return str(int(left) + int(right))


agent = openai_agents_sdk(Agent(name="calculator agent", instructions="", tools=[calculator]),
                          reward=lambda row, final_output: float(final_output.strip() == "5"))
"""


def test_an_openai_agents_sdk_agent_trains_two_steps(tmp_path):
    """The SDK's runner calls the policy, runs its function tool and calls again, in every episode of both steps."""
    pytest.importorskip("agents", reason="needs the OpenAI Agents SDK (pip install 'hybridrl[agents]')")
    from taught_models import save_calculator_caller

    model = save_calculator_caller(tmp_path / "model")
    (tmp_path / "sdk_agent.py").write_text(SDK_AGENT)
    run(model, tmp_path / "sdk_agent.py", tmp_path / "run", "rollout.temperature=0.3")
    rows = read_metrics(tmp_path / "run")
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["agent/tool_calls"] == 1.0 and row["agent/turns"] == 2.0 and row["agent/env_failures"] == 0.0
        assert row["critic/score/mean"] == 1.0  # the adapter's reward: the SDK's final output is the tool's sum


EDITING_AGENT = '''
async def agent(row, client):
    """Answers, then asks again with its first answer summarised into a system message: two sequences."""
    first = await client.chat.completions.create(model="policy", messages=row["prompt"], max_tokens=4)
    said = (first.choices[0].message.content or "")[:4]
    summary = [{"role": "system", "content": f"said {said}"}, *row["prompt"]]
    again = await client.chat.completions.create(model="policy", messages=summary, max_tokens=4)
    return float(len(again.choices[0].message.content or "") % 3)
'''


def test_an_agent_that_edits_its_context_trains_every_sequence_of_its_episodes(agent_setup, tmp_path):
    """``agent_max_sequences=2``: each episode's two sequences are both trained (16 rows a step), the steps run."""
    model, _, _ = agent_setup
    (tmp_path / "editing_agent.py").write_text(EDITING_AGENT)
    run(model, tmp_path / "editing_agent.py", tmp_path / "run", "rollout.multi_turn.agent_max_sequences=2")
    rows = read_metrics(tmp_path / "run")
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["agent/split_sequences"] == 1.0 and row["agent/dropped_sequences"] == 0.0
        assert row["agent/trained_sequences"] == 2.0 and row["agent/env_failures"] == 0.0
        assert math.isfinite(row["actor/pg_loss"]) and row["actor/grad_norm"] > 0
