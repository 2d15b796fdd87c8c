"""An OpenAI Agents SDK agent as the rollout's episodes (``hybridrl.gateway.adapters.openai_agents_sdk``): the SDK's
own runner calls the gateway over a real vLLM CPU engine, runs its function tool and calls again; the row the trainer
gets is the conversation the engine sampled — the tool call and the answer in the loss, the SDK's tool message
out of it — as one sequence, with the reward the adapter computed from the SDK's final output."""

from __future__ import annotations

import pytest
import torch
from taught_models import CALL, RENDERED_TOOLS, save_calculator_caller
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


def sdk_rows(tokenizer, questions: list[str]) -> Batch:
    """Prompt rows for the SDK agent: each question as a user message, "5" its answer."""
    ids = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False) for q in questions]
    count = len(questions)
    return Batch(tensors={Fields.INPUT_IDS: torch.tensor(ids),
                          Fields.ATTENTION_MASK: torch.ones(count, len(ids[0]), dtype=torch.long)},
                 non_tensors={Fields.UID: [f"q{k}" for k in range(count)],
                              DataFields.MESSAGES: [[{"role": "user", "content": q}] for q in questions],
                              DataFields.GROUND_TRUTH: ["5"] * count, DataFields.EXTRA_INFO: [{}] * count,
                              DataFields.DATA_SOURCE: ["sdk"] * count})


def test_an_agents_sdk_agent_with_a_function_tool_plays_token_exact_episodes(engine, tokenizer, tmp_path):
    agent_file = tmp_path / "sdk_agent.py"
    agent_file.write_text(SDK_AGENT)
    runner = EpisodeRunner(MultiTurnConfig(enable=True, agent=f"{agent_file}:agent"), tokenizer, MAX_PROMPT,
                           MAX_RESPONSE)
    rows = sdk_rows(tokenizer, ["3+4=", "1+2="])
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


def test_an_sdk_episode_that_spends_its_budget_on_the_tool_loop_is_scored_not_dropped(engine, tokenizer, tmp_path):
    """The budget holds the call and the tool's result, not the answer: the gateway's next reply is empty with
    finish_reason='length', which the SDK raises on. The episode is scored (final output "", reward 0) and its call
    trained, not failed."""
    agent_file = tmp_path / "sdk_agent.py"
    agent_file.write_text(SDK_AGENT)
    call_ids = tokenizer.encode(f"{CALL}{tokenizer.eos_token}", add_special_tokens=False)
    observation_ids = tokenizer.encode("<|tool|>5<|assistant|>", add_special_tokens=False)
    budget = len(call_ids) + len(observation_ids)
    runner = EpisodeRunner(MultiTurnConfig(enable=True, agent=f"{agent_file}:agent"), tokenizer, MAX_PROMPT, budget)
    batch = runner.run(engine, sdk_rows(tokenizer, ["3+4="]), SamplingParams(max_new_tokens=budget, temperature=0))
    assert list(batch[EPISODE_FAILURE]) == [""] and batch[AGENT_REWARDS].tolist() == [0.0]
    mask = batch[Fields.RESPONSE_MASK][0].bool()
    assert batch[Fields.RESPONSES][0][mask].tolist() == call_ids  # the call is in the loss


def test_a_served_tool_conversation_shows_the_model_the_ids_a_training_rollout_has(engine, tokenizer):
    """``hybridrl serve`` keeps no session: a client sends the model's tool call back as ``tool_calls`` and the chat
    template renders it again. The prompt the served model then sees (the response's ``prompt_token_ids``) is the
    training rollout's ids — the trainer's gateway continues from the ids it sampled — and both answer "5". The demo's
    template once dropped the call (the model saw ``<|assistant|><eos><|tool|>5``), and the answer went wrong."""
    import openai

    from hybridrl.agents.trajectory import drops_tool_calls
    from hybridrl.gateway.app import Gateway
    from hybridrl.gateway.service import GatewayBackend, GatewayService
    from hybridrl.rollout.server import ReplicaServer

    assert not drops_tool_calls(tokenizer)
    server = ReplicaServer(engine.requests, version=lambda: engine.policy_version)
    backend = GatewayBackend(server, tokenizer, engine.eos_token_ids, MAX_PROMPT + MAX_RESPONSE, "tiny", 40)
    served, trained = GatewayService(backend, record_sessions=False, only_its_model_name=True), GatewayService(backend)
    try:
        with Gateway(served) as serve_front, Gateway(trained) as train_front:
            clients = {"served": openai.OpenAI(base_url=serve_front.base_url, api_key="-", max_retries=0),
                       "trained": openai.OpenAI(base_url=train_front.session_url("episode"), api_key="-",
                                                max_retries=0)}
            answers, second_prompts = {}, {}
            for side, client in clients.items():
                messages = [{"role": "user", "content": "3+4="}]
                call = client.chat.completions.create(model="tiny", messages=messages, tools=RENDERED_TOOLS,
                                                      temperature=0, max_tokens=40)
                assert call.choices[0].message.tool_calls, side
                messages += [call.choices[0].message.model_dump(exclude_none=True),
                             {"role": "tool", "tool_call_id": call.choices[0].message.tool_calls[0].id,
                              "content": "5"}]
                answer = client.chat.completions.create(model="tiny", messages=messages, tools=RENDERED_TOOLS,
                                                        temperature=0, max_tokens=40)
                answers[side], second_prompts[side] = answer.choices[0].message.content, answer.prompt_token_ids
            [sequence] = trained.take_session("episode").sequences()
    finally:
        server.close()
    assert answers == {"served": "5", "trained": "5"}
    rollout_ids = sequence.prompt_ids + sequence.response_ids
    assert second_prompts["served"] == second_prompts["trained"] == rollout_ids[:len(second_prompts["served"])]
    assert tokenizer.decode(second_prompts["served"]).endswith(f"{CALL}{tokenizer.eos_token}<|tool|>5<|assistant|>")


def test_a_template_that_drops_tool_calls_is_told_apart():
    from hybridrl.agents.trajectory import drops_tool_calls
    from hybridrl.utils.tiny_model import CHAT_TEMPLATE, TOOL_CHAT_TEMPLATE, build_char_tokenizer

    tokenizer = build_char_tokenizer(tool_chat=True)
    assert not drops_tool_calls(tokenizer)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE.replace("{% for call in message['tool_calls'] or [] %}",
                                                         "{% for call in [] %}")
    assert drops_tool_calls(tokenizer)
    tokenizer.chat_template = CHAT_TEMPLATE  # no tools at all: nothing to drop
    assert not drops_tool_calls(tokenizer)
