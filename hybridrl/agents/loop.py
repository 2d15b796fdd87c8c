"""Many multi-turn episodes in flight on one request engine, token-exact (``trajectory.py``).

The loop submits every episode's first turn, then steps the engine (continuous batching: all running turns advance
together). When a turn finishes, its ids are appended to the trajectory as generated and the decoded text goes to
the episode's environment — in a worker thread, so a slow tool holds up only its own episode while the engine keeps
generating for the others. When the environment answers, the observation ids are appended and the next turn is
submitted. An episode ends when the environment says done, after ``max_assistant_turns`` model turns, when its
response budget (``max_response_tokens``, model and observation ids together) is spent, or when its environment
fails (raises, hangs past ``env_step_timeout_s``, breaks the return contract): counted in the trajectory, never
raised.

The engine is anything with ``submit(prompt_ids, params, request_id=..., streamed=...) -> id``, ``step() ->
[Completion]`` and ``has_work()`` — ``hybridrl.rollout.vllm_requests.VLLMRequests``.
"""

from __future__ import annotations

import concurrent.futures as futures
import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Protocol, Sequence

from hybridrl.agents.environment import Environment, EnvironmentFailure, Message, StepResult, checked
from hybridrl.agents.trajectory import ChatRenderer, TemplateMismatch, Trajectory
from hybridrl.rollout.base import SamplingParams
from hybridrl.utils.seeding import derive_seed

logger = logging.getLogger(__name__)


class RequestEngine(Protocol):
    def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams, request_id: Optional[str] = None,
               streamed: bool = True) -> str: ...

    def step(self) -> list[Any]: ...

    def has_work(self) -> bool: ...


@dataclass(frozen=True)
class LoopLimits:
    """``max_assistant_turns``: model turns per episode; ``max_response_tokens``: response ids per episode (model +
    observation; the trained response width); ``env_step_timeout_s``: longest an environment may take for a step."""

    max_assistant_turns: int
    max_response_tokens: int
    env_step_timeout_s: float = 30.0
    tool_workers: int = 32


@dataclass
class Episode:
    """One episode's state: its environment, conversation (text), trajectory (ids) and sampling."""

    index: int
    environment: Environment
    messages: list[Message]
    trajectory: Trajectory
    params: SamplingParams
    pending: Optional[futures.Future] = None
    started: float = 0.0
    done: bool = False


class AgentLoop:
    """Runs episodes to the end on ``engine`` (see the module docstring)."""

    def __init__(self, engine: RequestEngine, renderer: ChatRenderer, limits: LoopLimits,
                 stop_ids: Sequence[int]) -> None:
        self.engine, self.renderer, self.limits, self.stop_ids = engine, renderer, limits, list(stop_ids)

    def run(self, environments: Sequence[Environment], rows: Sequence[Mapping[str, Any]],
            params: Sequence[SamplingParams]) -> list[Trajectory]:
        """One episode per ``(environment, row, params)``; trajectories in the same order."""
        episodes = [self._start(index, env, row, sampling)
                    for index, (env, row, sampling) in enumerate(zip(environments, rows, params))]
        by_request = {}
        for episode in episodes:
            if not episode.done:
                by_request[self._submit(episode)] = episode
        # not a `with` block: leaving one joins the threads, and a hung environment's thread never ends
        pool = futures.ThreadPoolExecutor(self.limits.tool_workers, thread_name_prefix="agent-env")
        try:
            while not all(episode.done for episode in episodes):
                self._advance_engine(by_request, pool)
                self._collect_environments(episodes, by_request, block=not self.engine.has_work())
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        for episode in episodes:
            _close(episode)
        return [episode.trajectory for episode in episodes]

    def _start(self, index: int, environment: Environment, row: Mapping[str, Any],
               params: SamplingParams) -> Episode:
        try:
            messages = environment.reset(row)
            prompt = self.renderer.prompt_ids(messages)
        except Exception as error:  # noqa: BLE001 - an environment's failure ends its episode, never the run
            episode = Episode(index, environment, [], Trajectory(prompt_ids=[]), params)
            self._fail(episode, f"reset() raised {type(error).__name__}: {error}")
            return episode
        return Episode(index, environment, list(messages), Trajectory(prompt_ids=prompt), params)

    def _submit(self, episode: Episode) -> str:
        """Queue the episode's next model turn (its budget: what is left of the response length)."""
        trajectory = episode.trajectory
        budget = self.limits.max_response_tokens - len(trajectory.response_ids)
        turn_params = replace(episode.params, max_new_tokens=min(episode.params.max_new_tokens, budget))
        if turn_params.seed is not None:
            turn_params = replace(turn_params, seed=derive_seed(turn_params.seed, "turn", trajectory.turns))
        return self.engine.submit(trajectory.ids, turn_params, request_id=f"e{episode.index}t{trajectory.turns}",
                                  streamed=False)

    def _advance_engine(self, by_request: dict, pool: futures.ThreadPoolExecutor) -> None:
        if not self.engine.has_work():
            return
        for completion in self.engine.step():
            if not completion.finished:
                continue
            episode = by_request.pop(completion.request_id)
            episode.trajectory.add_model_turn(completion.token_ids, completion.log_probs, completion.policy_versions)
            text = self.renderer.decode(completion.token_ids, self.stop_ids)
            episode.messages.append({"role": "assistant", "content": text})
            episode.trajectory.final_text = text
            spent = len(episode.trajectory.response_ids) >= self.limits.max_response_tokens
            if spent or completion.finish_reason not in ("stop", "length"):  # budget spent (or the turn aborted)
                episode.trajectory.end = "budget"
                episode.done = True
                continue
            episode.started = time.monotonic()
            episode.pending = pool.submit(episode.environment.step, text)

    def _collect_environments(self, episodes: Sequence[Episode], by_request: dict, block: bool) -> None:
        """Take the environments' finished answers; wait for one when the engine has nothing to do."""
        waiting = [episode for episode in episodes if episode.pending is not None]
        if not waiting:
            return
        if block:
            deadline = min(episode.started for episode in waiting) + self.limits.env_step_timeout_s
            futures.wait([episode.pending for episode in waiting], timeout=max(deadline - time.monotonic(), 0.0),
                         return_when=futures.FIRST_COMPLETED)
        for episode in waiting:
            if episode.pending.done():
                self._answered(episode, by_request)
            elif time.monotonic() - episode.started > self.limits.env_step_timeout_s:
                episode.pending = None
                self._fail(episode, f"step() took longer than {self.limits.env_step_timeout_s:g} s "
                                    "(rollout.multi_turn.env_step_timeout_s)")

    def _answered(self, episode: Episode, by_request: dict) -> None:
        pending, episode.pending = episode.pending, None
        try:
            result = checked(pending.result())
        except Exception as error:  # noqa: BLE001
            what = str(error) if isinstance(error, EnvironmentFailure) else f"step() raised {type(error).__name__}: {error}"
            self._fail(episode, what)
            return
        trajectory = episode.trajectory
        trajectory.add_reward(float(result.reward))
        trajectory.count(result.info)
        if result.done or trajectory.turns >= self.limits.max_assistant_turns:
            trajectory.end = "done" if result.done else "max_turns"
            episode.done = True
            return
        self._append_observations(episode, result)
        if not episode.done:
            by_request[self._submit(episode)] = episode

    def _append_observations(self, episode: Episode, result: StepResult) -> None:
        trajectory = episode.trajectory
        try:
            ids, matched = self.renderer.observation_ids(episode.messages, result.observations, trajectory.ids)
        except TemplateMismatch:
            raise
        except Exception as error:  # noqa: BLE001 - e.g. text the tokenizer cannot encode
            self._fail(episode, f"the chat template / tokenizer cannot encode the observation: "
                                f"{type(error).__name__}: {error}")
            return
        trajectory.prefix_mismatches += not matched
        episode.messages += result.observations
        trajectory.add_observation(ids)
        if len(trajectory.response_ids) >= self.limits.max_response_tokens:
            trajectory.truncate(self.limits.max_response_tokens)
            trajectory.end = "budget"
            episode.done = True

    def _fail(self, episode: Episode, reason: str) -> None:
        logger.warning("episode %d: environment failure, the episode ends: %s", episode.index, reason)
        episode.trajectory.failure, episode.trajectory.end, episode.done = reason, "failed", True
        episode.trajectory.count({"env_failures": 1.0})


def _close(episode: Episode) -> None:
    try:
        episode.environment.close()
    except Exception as error:  # noqa: BLE001
        logger.warning("episode %d: close() raised %s: %s", episode.index, type(error).__name__, error)
