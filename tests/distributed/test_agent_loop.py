"""The multi-turn agent loop on a real vLLM engine (CPU build, tiny fp32 model with a tool-calling chat template):
trajectories are token-exact, observation ids are the template's, slow tools do not serialise episodes, and every
kind of environment failure ends only its own episode, counted."""

from __future__ import annotations

import threading
import time

import pytest
from transformers import AutoTokenizer
from vllm_helpers import RecordingRequests, cpu_engine

from hybridrl.agents.environment import Environment, StepResult
from hybridrl.agents.loop import AgentLoop, LoopLimits
from hybridrl.agents.trajectory import ChatRenderer
from hybridrl.rollout.base import SamplingParams
from hybridrl.utils.tiny_model import save_tiny_model

pytest.importorskip("vllm", reason="needs vLLM (pip install 'hybridrl[cpu]')")
pytestmark = pytest.mark.distributed

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "arithmetic", "parameters": {}}}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("agent_loop") / "model", tool_chat=True)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def engine(model_dir, tokenizer):
    engine = cpu_engine(model_dir, tokenizer, max_model_len=256)
    yield engine
    engine.close()


class Echo(Environment):
    """Answers every turn with a tool message (sleeping ``delay`` first); done after ``turns`` model turns."""

    def __init__(self, turns: int = 3, delay: float = 0.0, intervals: list | None = None) -> None:
        self.turns, self.delay, self.seen, self.intervals = turns, delay, 0, intervals

    def step(self, model_text: str) -> StepResult:
        started = time.monotonic()
        time.sleep(self.delay)
        self.seen += 1
        if self.intervals is not None:
            self.intervals.append((started, time.monotonic()))
        done = self.seen >= self.turns
        return StepResult(observations=[] if done else [{"role": "tool", "content": f"{self.seen}+{len(model_text)}"}],
                          reward=0.25, done=done)


def run(engine, environments, *, max_response_tokens=120, turn_tokens=12, timeout_s=30.0, recording=None):
    renderer = ChatRenderer(engine_tokenizer(engine), TOOLS)
    loop = AgentLoop(recording or engine.requests, renderer,
                     LoopLimits(max_assistant_turns=3, max_response_tokens=max_response_tokens,
                                env_step_timeout_s=timeout_s), stop_ids=engine.eos_token_ids)
    rows = [{"prompt": [{"role": "user", "content": f"{index}*7="}]} for index in range(len(environments))]
    params = [SamplingParams(max_new_tokens=turn_tokens, temperature=1.0, seed=index) for index in range(len(rows))]
    return loop.run(environments, rows, params), renderer


def engine_tokenizer(engine):
    return engine.llm.get_tokenizer()


def test_trajectory_ids_are_the_engines_and_the_templates(engine, tokenizer):
    """Model segments equal the engine's completions id for id (with their log-probs); observation segments equal
    the chat template's rendering of the conversation's next part; the response mask marks exactly the former; each
    step's reward is recorded on the last id of the model turn it answered."""
    recording = RecordingRequests(engine.requests)
    trajectories, renderer = run(engine, [Echo() for _ in range(4)], recording=recording)
    for index, trajectory in enumerate(trajectories):
        assert trajectory.end in ("done", "budget"), trajectory.end
        position, conversation, turn_ends = 0, [{"role": "user", "content": f"{index}*7="}], []
        assert trajectory.prompt_ids == renderer.prompt_ids(conversation)
        for turn in range(trajectory.turns):
            completion = recording.finished_by_id[f"e{index}t{turn}"]
            ids = trajectory.response_ids[position:position + len(completion.token_ids)]
            assert ids == completion.token_ids
            assert trajectory.log_probs[position:position + len(ids)] == completion.log_probs
            assert set(trajectory.response_mask[position:position + len(ids)]) == {1}
            position += len(ids)
            turn_ends.append(position - 1)
            conversation.append({"role": "assistant", "content": renderer.decode(completion.token_ids,
                                                                                 engine.eos_token_ids)})
            if turn + 1 < trajectory.turns:
                conversation.append({"role": "tool", "content": f"{turn + 1}+{len(conversation[-1]['content'])}"})
                rendered = renderer.ids(conversation, generation_prompt=True)
                observation = rendered[len(trajectory.prompt_ids) + position:]
                assert trajectory.response_ids[position:position + len(observation)] == observation
                assert set(trajectory.response_mask[position:position + len(observation)]) == {0}
                assert set(trajectory.log_probs[position:position + len(observation)]) == {0.0}
                position += len(observation)
        assert position == len(trajectory.response_ids)
        assert trajectory.prefix_mismatches == 0
        answered = len(trajectory.turn_rewards)   # a turn cut by the budget gets no step; one that ends it does
        assert answered == trajectory.turns or (trajectory.end == "budget" and answered == trajectory.turns - 1)
        assert trajectory.turn_rewards == [(end, 0.25) for end in turn_ends[:answered]]


def test_episodes_with_a_slow_tool_run_concurrently(engine):
    """8 episodes × 3 environment answers of 0.2 s each: serialised, that is ≥ 4.8 s of tool time alone; the steps
    must overlap (several environments answering at once), so the batch takes about one episode's tool time."""
    intervals: list = []
    started = time.monotonic()
    trajectories, _ = run(engine, [Echo(turns=3, delay=0.2, intervals=intervals) for _ in range(8)],
                          max_response_tokens=200)
    wall = time.monotonic() - started
    assert all(t.turns == 3 or t.end == "budget" for t in trajectories)
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    most, running = 0, 0
    for _, delta in events:
        running += delta
        most = max(most, running)
    serial = 0.2 * len(intervals)
    print(f"\n{len(intervals)} tool answers of 0.2 s: {wall:.2f} s wall ({serial:.1f} s if serialised), "
          f"up to {most} at once")
    assert most >= 4, most


class Raises(Environment):
    def step(self, model_text):
        raise ValueError("the environment broke")


class Hangs(Environment):
    def __init__(self):
        self.release = threading.Event()

    def step(self, model_text):
        self.release.wait(5.0)
        return StepResult(done=True)


class WrongTypes(Environment):
    def __init__(self, result):
        self.result = result

    def step(self, model_text):
        return self.result


def test_environment_failures_end_only_their_own_episode(engine):
    hangs = Hangs()
    environments = [Raises(), hangs, WrongTypes("not a StepResult"),
                    WrongTypes(StepResult(observations=[{"role": "tool", "content": 42}])),
                    WrongTypes(StepResult(reward="high", done=True)), Echo()]
    trajectories, _ = run(engine, environments, timeout_s=0.5)
    hangs.release.set()
    failures = [t.failure for t in trajectories]
    assert "step() raised ValueError: the environment broke" in failures[0]
    assert "longer than 0.5 s" in failures[1]
    assert "returned str, not a StepResult" in failures[2]
    assert "each must be a chat message with text content" in failures[3]
    assert "the reward 'high': it must be a finite number" in failures[4]
    assert all(t.end == "failed" and t.counters["env_failures"] == 1.0 for t in trajectories[:5])
    assert failures[5] is None and trajectories[5].end in ("done", "budget")
    assert trajectories[5].reward == pytest.approx(0.25 * trajectories[5].turns)


def test_the_response_budget_cuts_an_episode(engine):
    [trajectory], _ = run(engine, [Echo(turns=3)], max_response_tokens=20, turn_tokens=12)
    assert trajectory.end == "budget" and len(trajectory.response_ids) <= 20
    assert len(trajectory.response_ids) == len(trajectory.response_mask) == len(trajectory.log_probs)
