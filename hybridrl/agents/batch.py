"""Trajectories → the rollout ``Batch`` every training stage reads, with observation tokens kept out of the loss.

Layout (as ``protocol.rollout_layout``): ``prompts`` ``[B, P]`` left-padded, ``responses`` ``[B, R]`` right-padded,
``input_ids`` / ``attention_mask`` ``[B, P + R]``. Two differences from a single-turn rollout: the attention mask is 1
on *every* response id (observations are context the model attends to), while ``response_mask`` is 1 only on the
model's own ids — the loss, the token-mean normaliser, the KL and the log-prob gate all read ``response_mask``.
``rollout_log_probs`` are the engine's for model ids and 0 on observations.

Per row also: ``final_response`` (non-tensor: the text of the last model turn — what the reward function scores),
``episode_failure`` (non-tensor: why the episode's environment failed, ``""`` if it did not),
``episode_rewards`` ``[B]`` (the environment's own rewards, summed over steps), for episodes of a user's agent
``agent_rewards`` ``[B]`` (the reward it returned, NaN where it left the reward to the reward function) and
``episode_sequences`` (non-tensor: its other training sequences, ``SequenceIds`` as plain dicts, for
``agents/episode_rows.py``), with
``rollout.multi_turn.reward_placement=turn_end`` also ``turn_rewards`` ``[B, R]`` (each step's reward on the last id of
the model turn it answered, 0 elsewhere), and ``agent_stats`` ``[B, K]`` (columns :data:`AGENT_STATS`), from which the
controller logs per-batch means.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import torch

from hybridrl.agents.trajectory import Trajectory
from hybridrl.protocol import Batch, Fields

FINAL_RESPONSE = "final_response"
EPISODE_FAILURE = "episode_failure"
EPISODE_REWARDS = "episode_rewards"
AGENT_REWARDS = "agent_rewards"
TURN_REWARDS = "turn_rewards"
AGENT_STATS_FIELD = "agent_stats"
EPISODE_SEQUENCES = "episode_sequences"
AGENT_STATS = ("turns", "tool_calls", "tool_errors", "tool_timeouts", "observation_tokens", "cut_by_budget",
               "env_failures", "prefix_mismatches", "split_sequences", "dropped_sequences")


def _stats_row(trajectory: Trajectory) -> list[float]:
    counters = trajectory.counters
    return [float(trajectory.turns), counters.get("tool_calls", 0.0), counters.get("tool_errors", 0.0),
            counters.get("tool_timeouts", 0.0), counters.get("observation_tokens", 0.0),
            float(trajectory.end == "budget"), counters.get("env_failures", 0.0), float(trajectory.prefix_mismatches),
            counters.get("split_sequences", 0.0), counters.get("dropped_sequences", 0.0)]


def trajectories_to_batch(trajectories: Sequence[Trajectory], rows: Batch, response_length: int,
                          pad_token_id: int, prompt_width: int = 0, turn_rewards: bool = False,
                          agent_rewards: bool = False) -> Batch:
    """One row per trajectory; ``rows`` holds each trajectory's prompt row (already repeated ``n`` times), whose
    non-tensor fields (``uid``, ``data_source``, ground truth …) are carried over. ``prompt_width``: pad prompts to
    this many ids (so batches of different ranks concatenate); ``ValueError`` naming the row if one is longer.
    ``turn_rewards``: add the ``[B, R]`` per-turn rewards (``reward_placement=turn_end``); ``agent_rewards``: add
    the ``[B]`` rewards of a user's agent (every rank's batch has the field, so that they concatenate) and their
    other training sequences (``episode_sequences``: per row a list of ``SequenceIds`` as dicts)."""
    if len(rows) != len(trajectories):
        raise ValueError(f"{len(trajectories)} trajectories for {len(rows)} prompt rows")
    longest = max(max((len(t.prompt_ids) for t in trajectories), default=1), 1)
    if prompt_width and longest > prompt_width:
        row = next(i for i, t in enumerate(trajectories) if len(t.prompt_ids) == longest)
        raise ValueError(f"episode {row}: its prompt with the tools rendered is {longest} ids, more than the "
                         f"{prompt_width} allowed (data.max_prompt_length plus the tools' rendering)")
    width = prompt_width or longest
    count = len(trajectories)
    prompts = torch.full((count, width), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((count, width), dtype=torch.long)
    responses = torch.full((count, response_length), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((count, response_length), dtype=torch.long)
    context_mask = torch.zeros((count, response_length), dtype=torch.long)
    log_probs = torch.zeros((count, response_length), dtype=torch.float32)
    for row, trajectory in enumerate(trajectories):
        if trajectory.prompt_ids:
            prompts[row, width - len(trajectory.prompt_ids):] = torch.tensor(trajectory.prompt_ids)
            prompt_mask[row, width - len(trajectory.prompt_ids):] = 1
        length = min(len(trajectory.response_ids), response_length)
        responses[row, :length] = torch.tensor(trajectory.response_ids[:length], dtype=torch.long)
        response_mask[row, :length] = torch.tensor(trajectory.response_mask[:length], dtype=torch.long)
        context_mask[row, :length] = 1
        log_probs[row, :length] = torch.tensor(trajectory.log_probs[:length], dtype=torch.float32)
    tensors = {
        Fields.PROMPTS: prompts, Fields.RESPONSES: responses, Fields.RESPONSE_MASK: response_mask,
        Fields.INPUT_IDS: torch.cat([prompts, responses], dim=-1),
        Fields.ATTENTION_MASK: torch.cat([prompt_mask, context_mask], dim=-1),
        Fields.ROLLOUT_LOG_PROBS: log_probs * response_mask,
        EPISODE_REWARDS: torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        AGENT_STATS_FIELD: torch.tensor([_stats_row(t) for t in trajectories], dtype=torch.float32),
    }
    if turn_rewards:
        tensors[TURN_REWARDS] = _turn_rewards(trajectories, response_length)
    if agent_rewards:
        tensors[AGENT_REWARDS] = torch.tensor([math.nan if t.agent_reward is None else t.agent_reward
                                               for t in trajectories], dtype=torch.float32)
    non_tensors = {**dict(rows.non_tensors), FINAL_RESPONSE: [t.final_text for t in trajectories],
                   EPISODE_FAILURE: [t.failure or "" for t in trajectories]}
    if agent_rewards:  # plain values: a batch in flight is saved with asynchronous training's checkpoints
        non_tensors[EPISODE_SEQUENCES] = [[dataclasses.asdict(other) for other in t.other_sequences]
                                          for t in trajectories]
    return Batch(tensors=tensors, non_tensors=non_tensors, meta=rows.meta)


def _turn_rewards(trajectories: Sequence[Trajectory], response_length: int) -> torch.Tensor:
    """``[B, R]``: each step's reward at its turn's last model id (rewards of one position add up)."""
    rewards = torch.zeros((len(trajectories), response_length), dtype=torch.float32)
    for row, trajectory in enumerate(trajectories):
        for position, reward in trajectory.turn_rewards:
            rewards[row, min(position, response_length - 1)] += reward
    return rewards


DROPPED_UID_MARK = "#dropped-"
"""In the ``uid`` of a failed agent episode's row (:func:`out_of_groups`): a group of its own, with nothing to train."""


def is_dropped(uid: str) -> bool:
    """Whether ``uid`` is a failed agent episode's own group (:func:`out_of_groups`)."""
    return DROPPED_UID_MARK in str(uid)


def out_of_groups(batch: Batch) -> Batch:
    """``batch`` with each failed episode whose row takes no loss (a user's agent that raised or timed out) given
    a ``uid`` of its own: a group of one, so its reward of 0 enters no other row's group statistics (GRPO's mean
    and std, RLOO's baseline) — the episode is dropped, not scored as a failure of its prompt."""
    if EPISODE_FAILURE not in batch:
        return batch
    no_loss = (batch[Fields.RESPONSE_MASK].sum(-1) == 0).tolist()
    uids = list(batch[Fields.UID])
    for row, (failure, empty) in enumerate(zip(batch[EPISODE_FAILURE], no_loss)):
        if failure and empty:
            uids[row] = f"{uids[row]}{DROPPED_UID_MARK}{row}"  # a prompt's rows are all on one rank: unique
    non_tensors = {**dict(batch.non_tensors), Fields.UID: uids}
    return Batch(tensors=dict(batch.tensors), non_tensors=non_tensors, meta=batch.meta)


def agent_metrics(batch: Batch) -> dict[str, float]:
    """``agent/<stat>`` batch means of :data:`AGENT_STATS` (empty for a single-turn batch)."""
    if AGENT_STATS_FIELD not in batch:
        return {}
    means = batch[AGENT_STATS_FIELD].float().mean(dim=0).tolist()
    return {f"agent/{name}": value for name, value in zip(AGENT_STATS, means)}


class EpisodesFailedError(ValueError):
    """Every episode of a batch failed the same way (a tool class that cannot be built, an environment that always
    raises): training on it would learn nothing, so the run stops quoting the failure."""


def check_episode_failures(batch: Batch) -> None:
    """:class:`EpisodesFailedError` when every episode of ``batch`` failed with one and the same reason (the user's
    exception text, as the agent loop recorded it); some failures, or different ones, are counted
    (``agent/env_failures``) and logged by the loop, not raised."""
    if EPISODE_FAILURE not in batch or len(batch) == 0:
        return
    failures = [str(failure) for failure in batch[EPISODE_FAILURE]]
    if all(failures) and len(set(failures)) == 1:
        fix = ("Fix the agent (rollout.multi_turn.agent; rollout.multi_turn.agent_timeout_s bounds an episode)"
               if AGENT_REWARDS in batch else "Fix the tool or environment (rollout.multi_turn.tool_config_path, "
               "rollout.multi_turn.environment, or the rows' agent_name)")
        raise EpisodesFailedError(
            f"rollout.multi_turn: all {len(failures)} episodes of the batch failed with the same error, so there is "
            f"nothing to train on: {failures[0]}. {fix} and run again")
