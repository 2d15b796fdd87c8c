"""A user's agent as the rollout's episodes (``rollout.multi_turn.agent``): plain ``openai`` client code, played
through a gateway over a real vLLM engine (CPU build, tiny fp32 model with a tool-calling chat template) by the
worker's ``EpisodeRunner``. The rows it returns hold exactly the ids and log-probs the engine sampled, with the
template's ids for the agent's other messages out of the loss; the agent's reward, its ``None`` and its failure
each land as described; a fixed seed gives the same rows twice; the rollout's sampling settings hold whatever the
agent asks."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer
from vllm_helpers import RecordingRequests, cpu_engine

from hybridrl.agents.batch import AGENT_REWARDS, AGENT_STATS, AGENT_STATS_FIELD, EPISODE_FAILURE, FINAL_RESPONSE
from hybridrl.config.multi_turn_schema import MultiTurnConfig
from hybridrl.data.loader import DataFields
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.workers.agent_rollout import EpisodeRunner

pytest.importorskip("vllm", reason="needs vLLM (pip install 'hybridrl[cpu]')")
pytestmark = pytest.mark.distributed

MAX_PROMPT, MAX_RESPONSE, TURNS = 40, 120, 3
AGENT_FILE = '''
async def agent(row, client):
    """Three model turns: each reply is answered by a tool result (or the user's nudge when it called no tool)."""
    if row["extra_info"].get("fail"):
        raise RuntimeError("the agent's own bug")
    messages = list(row["prompt"])
    if row["extra_info"].get("edit"):  # summarises its context: the second call does not extend the first
        first = await client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
        said = (first.choices[0].message.content or "")[:6]
        again = await client.chat.completions.create(
            model="policy", messages=[{"role": "system", "content": f"said {said}"}, *messages], max_tokens=8)
        return float(len(again.choices[0].message.content or "") % 5)
    replies = []
    for turn in range(3):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=10,
                                                     temperature=0.0, tools=TOOLS)
        message = reply.choices[0].message
        replies.append(message.content or "")
        messages.append(message.model_dump(exclude_none=True))
        if message.tool_calls:
            messages += [{"role": "tool", "tool_call_id": call.id, "content": "42"} for call in message.tool_calls]
        else:
            messages.append({"role": "tool", "content": f"turn {turn} said {len(replies[-1])} characters"})
    if row["extra_info"].get("leave_reward"):
        return None
    if row["extra_info"].get("long"):  # goes on past the episode's response budget
        for _ in range(40):
            reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=10, tools=TOOLS)
            if reply.choices[0].finish_reason == "length" and not reply.choices[0].message.content:
                return 1.0
            messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "content": "go"}]
        return -1.0
    return float(len(replies[-1]) % 5)

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "arithmetic",
                                           "parameters": {"type": "object", "properties": {}}}}]
'''


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("agent_gateway") / "model", tool_chat=True)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def engine(model_dir, tokenizer):
    engine = cpu_engine(model_dir, tokenizer, max_model_len=MAX_PROMPT + MAX_RESPONSE)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def runner(tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("agent_file") / "my_agent.py"
    path.write_text(AGENT_FILE)
    config = MultiTurnConfig(enable=True, agent=f"{path}:agent", agent_timeout_s=60.0)
    return EpisodeRunner(config, tokenizer, MAX_PROMPT, MAX_RESPONSE)


def prompt_rows(tokenizer, extra_infos) -> Batch:
    messages = [[{"role": "user", "content": f"{index}*7="}] for index in range(len(extra_infos))]
    ids = [tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True,
                                         return_dict=False) for conversation in messages]
    width = max(len(row) for row in ids)
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(row)) + list(row) for row in ids])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in ids])
    return Batch(tensors={Fields.INPUT_IDS: input_ids, Fields.ATTENTION_MASK: mask},
                 non_tensors={Fields.UID: [f"p{index}" for index in range(len(ids))],
                              DataFields.MESSAGES: messages, DataFields.GROUND_TRUTH: ["7"] * len(ids),
                              DataFields.EXTRA_INFO: list(extra_infos), DataFields.DATA_SOURCE: ["agent"] * len(ids)})


def generate(runner, engine, rows, recording=None, seed=11):
    params = SamplingParams(max_new_tokens=MAX_RESPONSE, temperature=0.7, top_p=0.9, seed=seed, n=2)
    target = engine if recording is None else SimpleNamespace(
        requests=recording, eos_token_ids=engine.eos_token_ids, pad_token_id=engine.pad_token_id,
        policy_version=engine.policy_version)
    return runner.run(target, rows, params)


def segments(mask: list[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of 1s."""
    runs, start = [], None
    for position, value in enumerate([*mask, 0]):
        if value and start is None:
            start = position
        elif not value and start is not None:
            runs.append((start, position))
            start = None
    return runs


def test_an_agents_episodes_train_exactly_what_the_engine_sampled(runner, engine, tokenizer):
    """Each model segment of a row is one of the engine's completions id for id, with its log-probs; the prompt is
    the template's rendering of the row's messages with the agent's tools; what lies between segments takes no loss;
    every request was sampled with the rollout's temperature and top-p (the agent asked for 0)."""
    recording = RecordingRequests(engine.requests)
    batch = generate(runner, engine, prompt_rows(tokenizer, [{}, {}]), recording)
    assert len(batch) == 4 and batch[AGENT_REWARDS].isfinite().all()
    assert {(params.temperature, params.top_p, params.do_sample) for params in recording.params} == {(0.7, 0.9, True)}
    completions = {tuple(completion.token_ids): completion for completion in recording.finished}
    assert len(recording.finished) == 4 * TURNS
    for row in range(len(batch)):
        mask = batch[Fields.RESPONSE_MASK][row].tolist()
        responses = batch[Fields.RESPONSES][row].tolist()
        runs = segments(mask)
        assert len(runs) == TURNS
        for start, end in runs:
            completion = completions[tuple(responses[start:end])]
            assert batch[Fields.ROLLOUT_LOG_PROBS][row, start:end].tolist() == pytest.approx(completion.log_probs,
                                                                                             abs=1e-6)
        observations = sum(end - start for start, end in zip([e for _, e in runs[:-1]], [s for s, _ in runs[1:]]))
        assert observations > 0 and batch[Fields.ROLLOUT_LOG_PROBS][row][torch.tensor(mask) == 0].abs().sum() == 0
        prompt = batch[Fields.PROMPTS][row][batch[Fields.ATTENTION_MASK][row, :MAX_PROMPT].bool()].tolist()
        tools = [{"type": "function", "function": {"name": "calculator", "description": "arithmetic",
                                                   "parameters": {"type": "object", "properties": {}}}}]
        assert prompt == list(tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{row // 2}*7="}], tools=tools, add_generation_prompt=True, tokenize=True,
            return_dict=False))
        final = batch[FINAL_RESPONSE][row]
        assert batch[AGENT_REWARDS][row].item() == float(len(final) % 5)
    stats = dict(zip(AGENT_STATS, batch[AGENT_STATS_FIELD].mean(dim=0).tolist()))
    assert stats["turns"] == TURNS and stats["split_sequences"] == 0 and stats["env_failures"] == 0


def test_a_fixed_seed_gives_the_same_rows_and_another_seed_other_rows(runner, engine, tokenizer):
    rows = prompt_rows(tokenizer, [{}, {}])
    first, again = generate(runner, engine, rows), generate(runner, engine, rows)
    assert torch.equal(first[Fields.INPUT_IDS], again[Fields.INPUT_IDS])
    assert torch.equal(first[Fields.ROLLOUT_LOG_PROBS], again[Fields.ROLLOUT_LOG_PROBS])
    other = generate(runner, engine, rows, seed=12)
    assert not torch.equal(first[Fields.RESPONSES], other[Fields.RESPONSES])


def test_a_failed_episode_is_counted_and_a_left_reward_is_nan(runner, engine, tokenizer):
    """The agent's exception ends only its episode: its rows take no loss, score 0 and carry the failure; an
    episode whose agent returned ``None`` keeps NaN for the reward function to fill."""
    batch = generate(runner, engine, prompt_rows(tokenizer, [{"fail": True}, {"leave_reward": True}]))
    failed, left = [0, 1], [2, 3]
    assert batch[Fields.RESPONSE_MASK][failed].sum() == 0 and batch[AGENT_REWARDS][failed].tolist() == [0.0, 0.0]
    assert all("RuntimeError: the agent's own bug" in batch[EPISODE_FAILURE][row] for row in failed)
    assert all(math.isnan(batch[AGENT_REWARDS][row].item()) for row in left)
    assert batch[Fields.RESPONSE_MASK][left].sum() > 0 and batch[EPISODE_FAILURE][2] == ""
    stats = batch[AGENT_STATS_FIELD][:, AGENT_STATS.index("env_failures")].tolist()
    assert stats == [1.0, 1.0, 0.0, 0.0]
    assert batch[Fields.PROMPTS].shape[1] == MAX_PROMPT  # every rank pads to data.max_prompt_length


def test_an_episode_past_its_response_budget_gets_empty_length_replies(runner, engine, tokenizer):
    """Once an episode's replies and tool results fill ``data.max_response_length``, the gateway answers empty
    with ``finish_reason`` ``length`` (sampling nothing, recording nothing): the agent ends as it would on a short
    reply, its episode trains, cut to the budget."""
    batch = generate(runner, engine, prompt_rows(tokenizer, [{"long": True}]))
    assert batch[AGENT_REWARDS].tolist() == [1.0, 1.0] and list(batch[EPISODE_FAILURE]) == ["", ""]
    assert batch[Fields.RESPONSE_MASK].shape[1] == MAX_RESPONSE and batch[Fields.RESPONSE_MASK].sum() > 0
    assert (batch[Fields.ATTENTION_MASK][:, MAX_PROMPT:].sum(-1) > MAX_RESPONSE - 12).all()  # filled to the budget


def test_the_readmes_agent_is_the_recipe_and_runs(engine, tokenizer):
    """The README's "Bring your own agent" code is ``recipes/agents/calculator_agent.py`` (less its docstring), and
    it plays episodes on the engine without failing."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    recipe = root / "recipes" / "agents" / "calculator_agent.py"
    readme = (root / "README.md").read_text()
    section = readme[readme.index("## Bring your own agent"):]
    shown = section[section.index("```python\n") + len("```python\n"):section.index("\n```\n")]
    assert shown == recipe.read_text().split("\n", 1)[1].strip("\n")
    runner = EpisodeRunner(MultiTurnConfig(enable=True, agent=f"{recipe}:agent"), tokenizer, MAX_PROMPT, MAX_RESPONSE)
    batch = generate(runner, engine, prompt_rows(tokenizer, [{}, {}]))
    assert list(batch[EPISODE_FAILURE]) == [""] * 4 and batch[Fields.RESPONSE_MASK].sum(-1).min() > 0
    assert torch.isnan(batch[AGENT_REWARDS]).all()  # it leaves every reward to the reward function


def test_the_trainers_gateway_cuts_max_tokens_to_the_budget_and_seeds_concurrent_calls_by_their_prompts(
        engine, tokenizer):
    """An agent asking for more tokens than the episode may have is served what is left (not refused); two calls
    of one session in flight at once are seeded by what they ask, so the rows are the same in every run whichever
    call arrives first."""
    import asyncio

    from hybridrl.gateway.app import Gateway
    from hybridrl.gateway.episodes import run_episodes
    from hybridrl.gateway.service import GatewayBackend, GatewayService, TrainingLimits
    from hybridrl.rollout.server import serve

    async def greedy_for_tokens(row, client):
        one = client.chat.completions.create(model="p", messages=row["prompt"], max_tokens=10_000)
        other = client.chat.completions.create(model="p", messages=[*row["prompt"], {"role": "tool", "content": "x"}],
                                               max_tokens=10_000)
        replies = await asyncio.gather(*(one, other) if row["order"] else (other, one))
        return float(sum(reply.usage.completion_tokens for reply in replies))

    def play(order: int) -> list:
        limits = TrainingLimits(SamplingParams(max_new_tokens=20, temperature=1.0, seed=5), MAX_PROMPT, 20)

        async def work(server):
            backend = GatewayBackend(server, tokenizer, engine.eos_token_ids, MAX_PROMPT + MAX_RESPONSE,
                                     max_tokens=20, training=limits)
            with Gateway(GatewayService(backend)) as gateway:
                return await run_episodes(greedy_for_tokens, [{"prompt": [{"role": "user", "content": "3*7="}],
                                                               "order": order}], gateway, session_prefix="e")
        [episode] = serve(engine.requests, work)
        assert episode.failure is None and 0 < episode.reward <= 40
        return sorted((call.prompt_ids, call.completion_ids) for call in episode.record.calls)
    assert play(0) == play(1)


def test_an_agent_that_edits_its_context_trains_both_sequences_with_one_advantage(tokenizer, engine, tmp_path):
    """The non-prefix case: an agent whose second call does not extend its first (it summarises). The episode is
    two sequences, neither re-tokenised: each is one of the engine's completions id for id behind the template's
    rendering of the conversation sent; with ``agent_max_sequences=2`` both are rows of the step, and the first gets
    the episode's advantage, computed once per episode (GRPO over the episodes' own rows)."""
    from hybridrl.agents.episode_rows import EPISODE_PART, EPISODE_ROW, episode_rows
    from hybridrl.config.schema import AlgorithmConfig
    from hybridrl.trainers.rl_steps import compute_advantages

    path = tmp_path / "my_agent.py"
    path.write_text(AGENT_FILE)
    config = MultiTurnConfig(enable=True, agent=f"{path}:agent", agent_timeout_s=60.0, agent_max_sequences=2)
    runner = EpisodeRunner(config, tokenizer, MAX_PROMPT, MAX_RESPONSE)
    recording = RecordingRequests(engine.requests)
    batch = generate(runner, engine, prompt_rows(tokenizer, [{"edit": True}, {"edit": True}]), recording)
    assert list(batch[EPISODE_FAILURE]) == [""] * 4
    assert batch[AGENT_STATS_FIELD][:, AGENT_STATS.index("split_sequences")].tolist() == [1.0] * 4
    sampled = {(tuple(recording.prompts_by_id[completion.request_id]), tuple(completion.token_ids)): completion
               for completion in recording.finished}
    assert len(sampled) == 8  # two calls per episode, each its own prompt
    scores = torch.zeros_like(batch[Fields.ROLLOUT_LOG_PROBS])
    scores[torch.arange(4), batch[Fields.RESPONSE_MASK].sum(-1) - 1] = batch[AGENT_REWARDS]
    batch[Fields.TOKEN_LEVEL_SCORES] = batch[Fields.TOKEN_LEVEL_REWARDS] = scores
    rows = episode_rows(batch, 2, engine.pad_token_id)
    assert len(rows) == 8
    for row in range(8):
        prompt = rows[Fields.PROMPTS][row][rows[Fields.ATTENTION_MASK][row, :MAX_PROMPT].bool()].tolist()
        length = int(rows[Fields.RESPONSE_MASK][row].sum())
        assert rows[Fields.RESPONSE_MASK][row, :length].all()  # one model turn, all in the loss
        completion = sampled[(tuple(prompt), tuple(rows[Fields.RESPONSES][row, :length].tolist()))]
        assert rows[Fields.ROLLOUT_LOG_PROBS][row, :length].tolist() == pytest.approx(completion.log_probs, abs=1e-6)
        assert ("said" in tokenizer.decode(prompt)) == (rows[EPISODE_PART][row] == 0)  # the last call is the row
    advantages, _ = compute_advantages(rows, AlgorithmConfig(adv_estimator="grpo"))
    own, _ = compute_advantages(batch, AlgorithmConfig(adv_estimator="grpo"))
    mask = rows[Fields.RESPONSE_MASK].bool()
    for row in range(8):
        episode = int(rows[EPISODE_ROW][row])
        expected = own[episode][batch[Fields.RESPONSE_MASK][episode].bool()][0].item()
        assert advantages[row][mask[row]].tolist() == pytest.approx([expected] * int(mask[row].sum()))
    assert advantages[rows[EPISODE_PART] == 1].abs().sum() > 0  # seed 11: a group's rewards differ, and it spreads
