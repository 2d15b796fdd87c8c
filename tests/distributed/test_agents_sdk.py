"""An OpenAI Agents SDK agent as the rollout's episodes (``hybridrl.gateway.adapters.openai_agents_sdk``): the SDK's
own runner calls the gateway over a real vLLM CPU engine, runs its function tool and calls again; the row the trainer
gets is the conversation the engine sampled — the tool call and the answer in the loss, the SDK's tool message
out of it — as one sequence, with the reward the adapter computed from the SDK's final output."""

from __future__ import annotations

import pytest
import torch
from taught_models import CALL, save_calculator_caller
from transformers import AutoTokenizer
from vllm_helpers import cpu_engine

from hybridrl.agents.batch import AGENT_REWARDS, AGENT_STATS, AGENT_STATS_FIELD, EPISODE_FAILURE
from hybridrl.config.multi_turn_schema import MultiTurnConfig
from hybridrl.data.loader import DataFields
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.workers.agent_rollout import EpisodeRunner

pytest.importorskip("vllm", reason="needs vLLM (pip install 'hybridrl[cpu]')")
pytest.importorskip("agents", reason="needs the OpenAI Agents SDK (pip install 'hybridrl[agents]')")
pytestmark = pytest.mark.distributed

MAX_PROMPT, MAX_RESPONSE = 40, 120
SDK_AGENT = '''
from agents import Agent, function_tool

from hybridrl.gateway.adapters import openai_agents_sdk

CALLS = []


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    CALLS.append(expression)
    left, right = expression.split("+")
    return str(int(left) + int(right))


agent = openai_agents_sdk(Agent(name="calculator agent", instructions="", tools=[calculator]),
                          reward=lambda row, final_output: float(final_output.strip() == "5"))
'''


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_calculator_caller(tmp_path_factory.mktemp("sdk") / "model")


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def engine(model_dir, tokenizer):
    engine = cpu_engine(model_dir, tokenizer, max_model_len=MAX_PROMPT + MAX_RESPONSE)
    yield engine
    engine.close()


def test_an_agents_sdk_agent_with_a_function_tool_plays_token_exact_episodes(engine, tokenizer, tmp_path):
    agent_file = tmp_path / "sdk_agent.py"
    agent_file.write_text(SDK_AGENT)
    runner = EpisodeRunner(MultiTurnConfig(enable=True, agent=f"{agent_file}:agent"), tokenizer, MAX_PROMPT,
                           MAX_RESPONSE)
    questions = ["3+4=", "1+2="]
    ids = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False) for q in questions]
    rows = Batch(tensors={Fields.INPUT_IDS: torch.tensor(ids), Fields.ATTENTION_MASK: torch.ones(2, len(ids[0]),
                                                                                               dtype=torch.long)},
                 non_tensors={Fields.UID: ["a", "b"], DataFields.MESSAGES: [[{"role": "user", "content": q}]
                                                                          for q in questions],
                              DataFields.GROUND_TRUTH: ["5", "5"], DataFields.EXTRA_INFO: [{}, {}],
                              DataFields.DATA_SOURCE: ["sdk", "sdk"]})
    batch = runner.run(engine, rows, SamplingParams(max_new_tokens=MAX_RESPONSE, temperature=0.3, seed=3, n=2))
    assert list(batch[EPISODE_FAILURE]) == [""] * 4 and batch[AGENT_REWARDS].tolist() == [1.0] * 4
    stats = dict(zip(AGENT_STATS, batch[AGENT_STATS_FIELD].mean(dim=0).tolist()))
    assert stats["tool_calls"] == 1.0 and stats["turns"] == 2.0 and stats["split_sequences"] == 0.0
    eos = tokenizer.eos_token
    for row in range(len(batch)):
        mask = batch[Fields.RESPONSE_MASK][row].bool()
        context = batch[Fields.ATTENTION_MASK][row, -MAX_RESPONSE:].bool()
        responses = batch[Fields.RESPONSES][row]
        assert tokenizer.decode(responses[mask]) == f"{CALL}{eos}5{eos}"  # what the model wrote, in the loss
        assert tokenizer.decode(responses[context & ~mask]) == "<|tool|>5<|assistant|>"  # the SDK's tool result
