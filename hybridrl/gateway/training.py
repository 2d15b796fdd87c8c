"""A user's agent as a trainer's episodes (``rollout.multi_turn.agent``): for one generation call, a gateway over
the replica's request queue, the agent run once per row on a session of its own — by default in a process of its
own (``agent_process.py``) — and each session's calls turned into the trajectory the trainer trains
(``agents/batch.py`` layout): the engine's ids as sampled, never the text re-encoded (``sessions.py``).

The gateway samples with the rollout's settings (``TrainingLimits``), so the log-probs the trainer recomputes are of
the distribution that sampled; each call is seeded from the generation call's seed, its session, its prompt ids and
how often the session asked for them before, so a fixed seed gives the same episodes whatever order the requests of
different episodes (or the different calls of one) arrive in.

An episode trains as one sequence when each call extends the conversation of an earlier one. When its calls split
(a conversation that does not: an agent that edits or summarises its context), it is several sequences, counted in
``agent/split_sequences``: the one holding its last call is the episode's row, and the latest
``rollout.multi_turn.agent_max_sequences - 1`` others ride with it (``Trajectory.other_sequences``) to be trained
with its advantage (``agents/episode_rows.py``); older ones are counted in ``agent/dropped_sequences``.

A failed episode (the agent raised or ran out of time) keeps its row with no token in the loss, is scored 0 and
counted in ``agent/env_failures``; the worker then makes it a group of its own (``agents.batch.out_of_groups``), so
it moves no other row's advantage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from hybridrl.agents.trajectory import SequenceIds, Trajectory
from hybridrl.gateway.app import Gateway
from hybridrl.gateway.episodes import AgentEpisode, AgentPlayer, run_episodes
from hybridrl.gateway.service import GatewayBackend, GatewayService, TrainingLimits
from hybridrl.gateway.sessions import TrainingSequence
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.server import ReplicaServer, serve


@dataclass(frozen=True)
class AgentRun:
    """How a trainer runs a user's agent: ``player`` plays it (in this process or one of its own), ``timeout_s``
    per episode, ``concurrency`` episodes at once, ``max_prompt_tokens``, the longest first prompt a sequence
    may have (``data.max_prompt_length``), and ``max_sequences`` kept per episode."""

    player: AgentPlayer
    timeout_s: float
    concurrency: int
    max_prompt_tokens: int
    max_sequences: int = 1
    """Training sequences kept per episode (``rollout.multi_turn.agent_max_sequences``)."""


def play_agent_episodes(requests: Any, tokenizer: Any, stop_ids: Sequence[int], max_model_len: int, run: AgentRun,
                        rows: Sequence[Mapping[str, Any]], params: SamplingParams,
                        version: Callable[[], int]) -> list[Trajectory]:
    """One trajectory per row: ``run.agent`` played on a gateway over ``requests`` (a request queue) for this call.

    ``params``: the rollout's sampling (``n`` is 1 here: ``rows`` are already one per episode); its
    ``max_new_tokens`` is each episode's response budget. ``version``: the policy version of the engine's weights.
    """
    limits = TrainingLimits(params, run.max_prompt_tokens, params.max_new_tokens)

    async def episodes_on(server: ReplicaServer) -> list[AgentEpisode]:
        backend = GatewayBackend(server, tokenizer, list(stop_ids), max_model_len,
                                 max_tokens=params.max_new_tokens, training=limits)
        with Gateway(GatewayService(backend)) as gateway:
            return await run_episodes(run.player, rows, gateway, timeout_s=run.timeout_s,
                                      concurrency=run.concurrency, session_prefix="episode")
    episodes = serve(requests, episodes_on, version=version, name="agent-gateway")
    return [episode_trajectory(episode, run.max_sequences) for episode in episodes]


def episode_trajectory(episode: AgentEpisode, max_sequences: int = 1) -> Trajectory:
    """The trajectory of ``episode``: the training sequence holding its last call, with up to ``max_sequences - 1``
    of its other sequences, the latest ones (see the module docstring). Its turns and tool calls count every call
    of the episode, whichever sequence holds it."""
    record = episode.record
    sequences = record.sequences()
    if not sequences:
        failure = episode.failure or "the agent made no call to the gateway"
        return _failed(Trajectory(prompt_ids=[]), failure)
    last_call = len(record.calls) - 1
    sequence = next(candidate for candidate in sequences if last_call in candidate.calls)
    others = sorted((other for other in sequences if other is not sequence), key=lambda other: other.calls[-1])
    kept = others[max(len(others) - (max_sequences - 1), 0):] if max_sequences > 1 else []
    trajectory = Trajectory(prompt_ids=list(sequence.prompt_ids), response_ids=list(sequence.response_ids),
                            response_mask=list(sequence.response_mask), log_probs=list(sequence.log_probs),
                            policy_versions=list(sequence.policy_versions), turns=len(record.calls),
                            end="done", prefix_mismatches=record.template_mismatches,
                            other_sequences=tuple(_ids(other) for other in kept))
    trajectory.final_text = str(record.calls[last_call].reply.get("content") or "")
    trajectory.counters = {
        "tool_calls": float(sum(len(call.reply.get("tool_calls") or ()) for call in record.calls)),  # all sequences
        "observation_tokens": float(len(sequence.response_mask) - sum(sequence.response_mask)),
        "split_sequences": float(len(sequences) - 1),
        "dropped_sequences": float(len(others) - len(kept))}
    if episode.failure is not None:
        return _failed(trajectory, episode.failure)
    trajectory.agent_reward = episode.reward
    return trajectory


def _ids(sequence: TrainingSequence) -> SequenceIds:
    return SequenceIds(list(sequence.prompt_ids), list(sequence.response_ids), list(sequence.response_mask),
                       list(sequence.log_probs))


def _failed(trajectory: Trajectory, failure: str) -> Trajectory:
    """``trajectory`` kept for its row's shape: nothing in the loss, reward 0, the failure counted."""
    trajectory.failure, trajectory.end, trajectory.agent_reward = failure, "failed", 0.0
    trajectory.response_mask = [0] * len(trajectory.response_ids)
    trajectory.other_sequences = ()
    trajectory.counters["env_failures"] = 1.0
    return trajectory
