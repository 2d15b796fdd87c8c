"""An agent episode's several training sequences as rows of the step, trained with the episode's one advantage.

An episode of a user's agent whose calls do not all extend one conversation (an agent that edits or summarises its
context) is several training sequences (``hybridrl/gateway/sessions.py``); none is re-tokenised into another. The
rollout batch keeps one row per episode — the sequence holding its last call, the one the reward scores — with the
others beside it (``episode_sequences``, non-tensor). Everything that compares episodes (scoring, dynamic sampling,
validation, pass@k) reads those rows. Right before the step's forwards, :func:`episode_rows` gives every episode
``rollout.multi_turn.agent_max_sequences`` = ``K`` rows: its own, then its other sequences, then rows holding no
response token (one pad id of prompt: nothing in the loss, no normaliser counts them). ``K`` is fixed, so the
step's rows are ``data.train_batch_size × rollout.n × K`` and the batch plan holds (``config/sizes.py``).

Advantages are computed on the episodes' own rows alone — a group's statistics see each episode once — and every
other sequence of an episode gets its advantage, one number per episode (:func:`shared_episode_advantages`).

Fields added: ``episode_part`` ``[N]`` (0: the episode's own row; ``k``: its ``k``-th other row) and
``episode_row`` ``[N]`` (the index of the episode's own row in the batch before :func:`episode_rows`), which follow
the rows through any reordering (``balance_batch``).
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch

from hybridrl.agents.batch import (AGENT_STATS, AGENT_STATS_FIELD, EPISODE_SEQUENCES, TURN_REWARDS,
                                   trajectories_to_batch)
from hybridrl.agents.trajectory import SequenceIds, Trajectory
from hybridrl.protocol import Batch, Fields

logger = logging.getLogger(__name__)

EPISODE_PART = "episode_part"
EPISODE_ROW = "episode_row"
LAYOUT_FIELDS = (Fields.PROMPTS, Fields.RESPONSES, Fields.RESPONSE_MASK, Fields.INPUT_IDS, Fields.ATTENTION_MASK,
                 Fields.ROLLOUT_LOG_PROBS)
"""The fields an episode's other row takes from its own sequence."""
PER_TOKEN_FIELDS = (Fields.TOKEN_LEVEL_SCORES, Fields.TOKEN_LEVEL_REWARDS, Fields.OLD_LOG_PROBS, Fields.REF_LOG_PROBS,
                    Fields.TEACHER_LOG_PROBS, Fields.VALUES, Fields.ADVANTAGES, Fields.RETURNS, Fields.ENTROPY,
                    Fields.IS_WEIGHTS, TURN_REWARDS)
"""``[B, R]`` values of the episode row's own tokens: 0 on its other rows (``token_policy_versions``: -1, unknown).
Every other field (the row's score, reward, uid, policy version …) is the episode's, copied."""


def episode_rows(batch: Batch, slots: int, pad_token_id: int) -> Batch:
    """``B`` episode rows → ``B × slots`` rows (module docstring): the ``B`` rows as they are, then for each
    ``k < slots`` a block of ``B`` rows holding each episode's ``k``-th other sequence (or no response).

    Other rows copy their episode's row but for the rollout layout (their own ids, masks and rollout log-probs),
    the per-token fields (:data:`PER_TOKEN_FIELDS`, zero: they are the episode row's tokens') and
    ``episode_sequences`` (empty); ``episode_sequences`` itself is dropped (in place for ``slots == 1``: the batch
    is returned). A batch without it (no agent) is returned as it is."""
    if EPISODE_SEQUENCES not in batch:
        return batch
    _say_when_sequences_are_dropped(batch, slots)
    if slots <= 1:
        batch.pop(EPISODE_SEQUENCES)
        return batch
    count = len(batch)
    prompt_width, response_width = batch[Fields.PROMPTS].shape[1], batch[Fields.RESPONSES].shape[1]
    blocks = [_with_episode_fields(batch, part=0)]
    for part in range(1, slots):
        sequences = [_nth(others, part) for others in batch[EPISODE_SEQUENCES]]
        trajectories = [_as_trajectory(sequence, pad_token_id) for sequence in sequences]
        layout = trajectories_to_batch(trajectories, batch.select(Fields.UID), response_width, pad_token_id,
                                       prompt_width)
        blocks.append(_other_rows(batch, layout, part))
    unfolded = Batch.concat(blocks)
    unfolded.pop(EPISODE_SEQUENCES)  # read: the workers need not carry them
    assert len(unfolded) == count * slots
    return unfolded


_DROPPING_SAID: set[int] = set()


def _say_when_sequences_are_dropped(batch: Batch, slots: int) -> None:
    """Said once per process and slot count: episodes split into more sequences than are trained."""
    if AGENT_STATS_FIELD not in batch or slots in _DROPPING_SAID:
        return
    dropped = batch[AGENT_STATS_FIELD][:, AGENT_STATS.index("dropped_sequences")]
    if bool((dropped > 0).any()):
        _DROPPING_SAID.add(slots)
        logger.warning("%d of %d agent episodes split into more than %d training sequence(s) (the agent sent a "
                       "conversation that does not extend its earlier calls'); the oldest are not trained "
                       "(agent/dropped_sequences). Raise rollout.multi_turn.agent_max_sequences to train them.",
                       int((dropped > 0).sum()), len(batch), slots)


def _nth(others, part: int) -> Optional[SequenceIds]:
    """The ``part``-th other sequence of an episode (``episode_sequences`` holds them as dicts), if it has one."""
    return SequenceIds(**others[part - 1]) if part - 1 < len(others) else None


def _as_trajectory(sequence: Optional[SequenceIds], pad_token_id: int) -> Trajectory:
    if sequence is None:  # an unused row: one pad id of prompt, no response
        return Trajectory(prompt_ids=[pad_token_id])
    return Trajectory(prompt_ids=list(sequence.prompt_ids), response_ids=list(sequence.response_ids),
                      response_mask=list(sequence.response_mask), log_probs=list(sequence.log_probs))


def _with_episode_fields(batch: Batch, part: int) -> Batch:
    rows = batch.select(*batch.keys())  # new fields on a shallow copy: Batch.concat copies the tensors once
    rows[EPISODE_PART] = torch.full((len(batch),), part, dtype=torch.long)
    rows[EPISODE_ROW] = torch.arange(len(batch), dtype=torch.long)
    return rows


def _other_rows(batch: Batch, layout: Batch, part: int) -> Batch:
    """``batch``'s rows as the ``part``-th other rows of their episodes, their sequences' ids from ``layout``."""
    rows = _with_episode_fields(batch, part)
    for key, value in batch.tensors.items():
        if key in LAYOUT_FIELDS:
            rows[key] = layout[key]
        elif key in PER_TOKEN_FIELDS:
            rows[key] = torch.zeros_like(value)
        elif key == Fields.TOKEN_POLICY_VERSIONS:
            rows[key] = torch.full_like(value, -1)
    rows[EPISODE_SEQUENCES] = [[] for _ in range(len(batch))]
    return rows


def episodes_only(batch: Batch) -> Batch:
    """The episodes' own rows of ``batch`` (all of it when it was not given :func:`episode_rows`)."""
    if EPISODE_PART not in batch:
        return batch
    return batch.index((batch[EPISODE_PART] == 0).nonzero().squeeze(-1))


Estimate = Callable[[Batch, Optional[torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]


def shared_episode_advantages(batch: Batch, estimate: Estimate) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns ``[N, R]`` of ``batch``: ``estimate(rows, positions)`` on the episodes' own rows
    (``positions``: their indices in ``batch``, ``None`` when every row is one), each other row given its episode's
    advantage and return on its response tokens. ``ValueError`` if the estimator gave an episode's tokens different
    advantages (there would be no one number to share)."""
    if EPISODE_PART not in batch:
        return estimate(batch, None)
    own = (batch[EPISODE_PART] == 0).nonzero().squeeze(-1)
    own_advantages, own_returns = estimate(batch.index(own), own)
    mask = batch[Fields.RESPONSE_MASK]
    episode_of_row = _episode_positions(batch, own)
    shared = []
    for name, values in (("advantages", own_advantages), ("returns", own_returns)):
        per_episode = _one_value_per_row(values, mask[own], name)
        full = per_episode[episode_of_row].unsqueeze(-1) * mask.to(values.dtype)
        full[own] = values
        shared.append(full)
    return shared[0], shared[1]


def _episode_positions(batch: Batch, own: torch.Tensor) -> torch.Tensor:
    """``[N]``: for each row, the position in ``own`` of its episode's own row."""
    episode = batch[EPISODE_ROW]
    position = torch.full((int(episode.max()) + 1,), -1, dtype=torch.long)
    position[episode[own]] = torch.arange(len(own))
    found = position[episode]
    if bool((found < 0).any()):
        raise ValueError("a row of an agent episode lost its episode's own row (episode_row names none)")
    return found


def _one_value_per_row(values: torch.Tensor, mask: torch.Tensor, name: str) -> torch.Tensor:
    """``[B]``: each row's value on its response tokens (0 for a row without one), which must be the same on all."""
    valid = mask.bool()
    first = valid.float().argmax(dim=-1)
    value = values.gather(-1, first.unsqueeze(-1)).squeeze(-1) * valid.any(dim=-1)
    same = torch.isclose(values, value.unsqueeze(-1), rtol=1e-6, atol=1e-6) | ~valid
    if not bool(same.all()):
        row = int((~same).any(dim=-1).nonzero()[0])
        raise ValueError(f"rollout.multi_turn.agent_max_sequences > 1 gives an episode's sequences its one advantage, "
                         f"and the estimator gave the tokens of episode row {row} different {name}; use an estimator "
                         "with one advantage per sequence (grpo, rloo, remax, ...), or set it to 1")
    return value


def episode_rows_metrics(batch: Batch) -> dict[str, float]:
    """``agent/trained_sequences``: rows with a token in the loss per episode (after :func:`episode_rows`)."""
    if EPISODE_PART not in batch:
        return {}
    episodes = int((batch[EPISODE_PART] == 0).sum())
    trained = int((batch[Fields.RESPONSE_MASK].sum(-1) > 0).sum())
    return {"agent/trained_sequences": trained / max(episodes, 1)}
