"""Multi-turn episodes on a tensor-parallel replica (vLLM's CPU build at ``t_g = 2`` over 2 Ray ranks): each episode
runs once per replica, on its TP rank 0, so a tool with side effects runs exactly once per call — and the ranks'
engines still step together (the other rank mirrors every request the leader queues)."""

from __future__ import annotations

import pytest
from distributed_helpers import cpu_pool, stop

from hybridrl.agents.batch import AGENT_STATS, AGENT_STATS_FIELD
from hybridrl.config import load_config
from hybridrl.data.loader import DataFields
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.runtime import WorkerGroup
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.workers.actor_worker import ActorRolloutRefWorker

# test-long (CI runs it): its TP-2 engine group and episodes took 98 s of the parallel suite (2026-12-06)
pytestmark = [pytest.mark.distributed, pytest.mark.long]

# An environment whose every step is a side effect: one line per call in a file, with the process that made it. Its
# name is its own: test-long runs every module in one process, and another module registers a "counting" of its own.
PLUGIN = '''
import os
from hybridrl.agents.environment import ENVIRONMENTS, Environment, StepResult

@ENVIRONMENTS.register("counting_on_tp_ranks")
class CountingEnvironment(Environment):
    def __init__(self, tools, reward, max_tool_calls=4):
        self.turns = 0

    def step(self, model_text):
        with open({log!r}, "a") as log:
            log.write(f"{{os.getpid()}}\\n")
        self.turns += 1
        return StepResult(observations=[{{"role": "user", "content": "go on"}}], done=self.turns >= 3)
'''


@pytest.fixture(scope="module")
def setup(tmp_path_factory, ray_runtime):
    root = tmp_path_factory.mktemp("agent_tp")
    model = save_tiny_model(root / "model")
    stop_after_digits(model)
    log = root / "calls.log"
    (root / "counting.py").write_text(PLUGIN.format(log=str(log)))
    config = load_config([
        f"model.path={model}", "model.dtype=float32", "trainer.n_gpus_per_node=2", "rollout=vllm_cpu",
        "rollout.tensor_model_parallel_size=2", "data.train_batch_size=4", "rollout.n=2",
        "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size_per_gpu=2", "data.max_response_length=96",
        "rollout.multi_turn.enable=true", "rollout.multi_turn.environment=counting_on_tp_ranks",
        "rollout.multi_turn.tools=[]", "rollout.multi_turn.max_assistant_turns=3",
        f"trainer.plugins=[{root / 'counting.py'}]"])
    group = WorkerGroup(ActorRolloutRefWorker, cpu_pool(ray_runtime, "agent_tp_pool", 2), name="actor_agent_tp",
                        args=(config, 10, False), tp_size=2)
    yield group, model, log
    stop(group)


def stop_after_digits(model_dir) -> None:
    """Every digit ends a turn too (the model's generation config): the random model's turns are then a few tokens
    long, and episodes take several steps within their budget."""
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = GenerationConfig.from_pretrained(model_dir)
    config.eos_token_id = [tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(list("0123456789"))]
    config.save_pretrained(model_dir)


def prompts(model_dir) -> Batch:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chats = [[{"role": "user", "content": text}] for text in ("12+34=", "7*8=", "100-1=", "5+5=")]
    ids = [tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=False) for chat in chats]
    encoded = tokenizer.pad({"input_ids": ids}, return_tensors="pt")
    return Batch(tensors={Fields.INPUT_IDS: encoded["input_ids"], Fields.ATTENTION_MASK: encoded["attention_mask"]},
                 non_tensors={Fields.UID: [f"p{i}" for i in range(4)], DataFields.MESSAGES: chats,
                              DataFields.GROUND_TRUTH: ["46", "56", "99", "10"], DataFields.EXTRA_INFO: [{}] * 4})


def test_each_environment_step_runs_once_per_call_at_tensor_parallel_two(setup):
    group, model_dir, log = setup
    for seed in (7, 8):  # twice: the ranks' engines must still agree after a multi-turn call
        log.write_text("")
        batch = group.call(ActorRolloutRefWorker.generate_sequences, prompts(model_dir),
                           SamplingParams(n=2, max_new_tokens=96, seed=seed))
        stats = dict(zip(AGENT_STATS, batch[AGENT_STATS_FIELD].sum(dim=0).tolist()))
        expected = stats["turns"] - stats["cut_by_budget"]  # every model turn is answered, but one cut by budget
        calls = log.read_text().splitlines()
        assert stats["env_failures"] == 0 and expected > len(batch), stats    # episodes with several steps
        assert len(calls) == expected, f"{len(calls)} environment steps ran for {expected} calls (seed {seed})"
        assert len(set(calls)) == 1, f"environment steps ran in {len(set(calls))} processes"
