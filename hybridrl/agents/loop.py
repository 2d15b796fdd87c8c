"""Many multi-turn episodes in flight on one replica, token-exact (``trajectory.py``).

Each episode is a coroutine on the replica's server (``rollout/server.py``): it asks for a model turn, appends its
ids to the trajectory as generated, hands the decoded text to the episode's environment — in a worker thread, so a
slow tool holds up only its own episode while the engine keeps generating for the others (continuous batching: all
running turns advance together) — appends the observation ids and asks for the next turn. Every episode's first
turn is submitted in one command, so all of them enter the engine before its first step. An episode ends when the
environment says done, after ``max_assistant_turns`` model turns, when its response budget
(``max_response_tokens``, model and observation ids together) is spent, or when its environment fails (raises, hangs
past ``env_step_timeout_s``, breaks the return contract): counted in the trajectory, never raised.

The engine is a request queue (``hybridrl.rollout.base.RequestQueue``: ``VLLMRequests``, or a tensor-parallel
leader's ``LeaderRequests``); the loop touches it only through the server, whose thread owns it for the call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as futures
import logging
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Mapping, Optional, Sequence

from hybridrl.agents.environment import Environment, EnvironmentFailure, Message, StepResult, checked
from hybridrl.agents.trajectory import ChatRenderer, TemplateMismatch, Trajectory
from hybridrl.rollout.base import RequestQueue, SamplingParams
from hybridrl.rollout.server import Request, ReplicaServer, serve
from hybridrl.rollout.completion import Completion
from hybridrl.utils.seeding import derive_seed

logger = logging.getLogger(__name__)


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
    done: bool = False


class AgentLoop:
    """Runs episodes to the end on ``engine`` (see the module docstring); ``server_args``: the replica server's
    keywords (``version``, ``name``)."""

    def __init__(self, engine: Optional[RequestQueue], renderer: ChatRenderer, limits: LoopLimits,
                 stop_ids: Sequence[int], **server_args: Any) -> None:
        self.engine, self.renderer, self.limits, self.stop_ids = engine, renderer, limits, list(stop_ids)
        self.server_args = server_args

    def run(self, environments: Sequence[Environment], rows: Sequence[Mapping[str, Any]],
            params: Sequence[SamplingParams]) -> list[Trajectory]:
        """One episode per ``(environment, row, params)``; trajectories in the same order."""
        episodes = [self._start(index, env, row, sampling)
                    for index, (env, row, sampling) in enumerate(zip(environments, rows, params))]
        try:
            if not all(episode.done for episode in episodes):  # every reset failed: nothing to generate
                serve(self.engine, lambda server: self._run_all(server, episodes), **self.server_args)
        finally:
            for episode in episodes:
                _close(episode)
        return [episode.trajectory for episode in episodes]

    async def _run_all(self, server: ReplicaServer, episodes: list[Episode]) -> None:
        running = [episode for episode in episodes if not episode.done]
        # not a `with` block: leaving one joins the threads, and a hung environment's thread never ends
        pool = futures.ThreadPoolExecutor(self.limits.tool_workers, thread_name_prefix="agent-env")
        try:
            first_turns = await server.submit_many([self._turn(episode) for episode in running], streamed=False)
            await asyncio.gather(*(self._play(server, pool, episode, first)
                                   for episode, first in zip(running, first_turns)))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

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

    def _turn(self, episode: Episode) -> Request:
        """The episode's next model turn (its budget: what is left of the response length)."""
        trajectory = episode.trajectory
        budget = self.limits.max_response_tokens - len(trajectory.response_ids)
        turn_params = replace(episode.params, max_new_tokens=min(episode.params.max_new_tokens, budget))
        if turn_params.seed is not None:
            turn_params = replace(turn_params, seed=derive_seed(turn_params.seed, "turn", trajectory.turns))
        return trajectory.ids, turn_params, f"e{episode.index}t{trajectory.turns}"

    async def _play(self, server: ReplicaServer, pool: futures.Executor, episode: Episode,
                    first_turn: Awaitable[Completion]) -> None:
        """The episode from its first model turn (already submitted) to its end."""
        turn = first_turn
        while True:
            text = self._model_turn(episode, await turn)
            if episode.done:
                return
            result = await self._environment_step(pool, episode, text)
            if result is None or self._answered(episode, result):
                return
            turn = server.generate(*self._turn(episode), streamed=False)

    def _model_turn(self, episode: Episode, completion: Completion) -> str:
        """Append a finished model turn; the episode ends here when its budget is spent (or the turn aborted)."""
        trajectory = episode.trajectory
        trajectory.add_model_turn(completion.token_ids, completion.log_probs, completion.policy_versions)
        text = self.renderer.decode(completion.token_ids, self.stop_ids)
        episode.messages.append({"role": "assistant", "content": text})
        trajectory.final_text = text
        spent = len(trajectory.response_ids) >= self.limits.max_response_tokens
        if spent or completion.finish_reason not in ("stop", "length"):
            trajectory.end, episode.done = "budget", True
        return text

    async def _environment_step(self, pool: futures.Executor, episode: Episode,
                                text: str) -> Optional[StepResult]:
        """The environment's answer to ``text`` (run in ``pool``), checked; ``None``: it failed, the episode ended."""
        timeout = self.limits.env_step_timeout_s
        answer = asyncio.wrap_future(pool.submit(episode.environment.step, text))
        done, _ = await asyncio.wait({answer}, timeout=timeout)
        if not done:  # its thread may run on (a hung tool): it is not waited for again
            answer.cancel()
            self._fail(episode, f"step() took longer than {timeout:g} s (rollout.multi_turn.env_step_timeout_s)")
            return None
        try:
            return checked(answer.result())
        except EnvironmentFailure as error:
            what = str(error)
        except Exception as error:  # noqa: BLE001
            what = f"step() raised {type(error).__name__}: {error}"
        self._fail(episode, what)
        return None

    def _answered(self, episode: Episode, result: StepResult) -> bool:
        """Record the environment's answer and append its observations; whether the episode ended."""
        trajectory = episode.trajectory
        trajectory.add_reward(float(result.reward))
        trajectory.count(result.info)
        if result.done or trajectory.turns >= self.limits.max_assistant_turns:
            trajectory.end = "done" if result.done else "max_turns"
            episode.done = True
            return True
        self._append_observations(episode, result)
        return episode.done

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
