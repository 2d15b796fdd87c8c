"""Anti-forgetting on the controller: the PPO-ptx SFT batch of each step, and prioritized prompt replay.

- :class:`PtxBatches` (``actor.ptx``): step ``s`` gets SFT examples ``s·B .. s·B + B − 1`` of the SFT source
  (``hybridrl.data.sft_source``), encoded in the rollout layout; the actor worker mixes them into every optimizer
  step (``hybridrl.engines.anti_forgetting.PtxHook``). A pure function of the step: nothing to checkpoint.
- :class:`PromptReplay` (``data.replay``): after scoring, every prompt of the step enters a
  :class:`~hybridrl.data.replay.PrioritizedReplay` keyed by its formatted text, with the spread of its group's
  scores as priority (re-seeing a prompt refreshes it). Before generating, ``round(fraction × B)`` loader prompts
  are replaced by prompts drawn from the buffer, each under a fresh ``uid`` (``replay-s<step>-<k>``) so its new
  group never merges with another. The buffer (plain lists and dicts) is saved in trainer checkpoints.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from hybridrl.config.schema import TrainConfig
from hybridrl.trainers.variants import prompt_rows
from hybridrl.data.dataset import TokenizedPrompt
from hybridrl.data.loader import DataFields, collate_prompts
from hybridrl.data.replay import PrioritizedReplay, group_score_spread
from hybridrl.data.sft import check_sft_roles, encode_sft_examples
from hybridrl.data.sft_source import build_sft_source
from hybridrl.protocol import Batch, Fields
from hybridrl.utils.seeding import derive_seed

PromptItem = dict[str, Any]
"""One prompt as plain values (``input_ids`` list and the data fields), so checkpoints load with ``weights_only``."""

_DATA_FIELDS = (DataFields.DATA_SOURCE, DataFields.GROUND_TRUTH, DataFields.EXTRA_INFO, DataFields.RAW_PROMPT)


class PtxBatches:
    """The SFT rows of each step for PPO-ptx (see the module docstring)."""

    def __init__(self, config: TrainConfig, tokenizer: Any) -> None:
        data, ptx = config.data, config.actor.ptx
        self.data, self.batch_size, self.tokenizer = data, ptx.batch_size, tokenizer
        self.source = build_sft_source(ptx.train_files, data.synthetic_task, data.synthetic_task_kwargs,
                                       seed=derive_seed(data.seed, "ptx"))
        check_sft_roles(tokenizer, self.source.examples, data.apply_chat_template)  # file rows named now

    def batch(self, step: int) -> Batch:
        """``actor.ptx.batch_size`` SFT rows for ``step``: ``input_ids``/``attention_mask`` ``[B, P + R]``,
        ``responses``/``response_mask`` ``[B, R]`` with ``R = data.max_response_length``."""
        return encode_sft_examples(self.tokenizer, self.source.take(step, self.batch_size),
                                   self.data.max_response_length, self.data.apply_chat_template,
                                   max_prompt_length=self.data.max_prompt_length)


def prompt_items(prompts: Batch) -> list[PromptItem]:
    """The rows of a prompt batch (``input_ids``/``attention_mask`` ``[G, P]`` + data fields) as plain values."""
    items = []
    for row in range(len(prompts)):
        ids = prompts[Fields.INPUT_IDS][row][prompts[Fields.ATTENTION_MASK][row].bool()]
        items.append({"input_ids": ids.tolist(), **{name: prompts[name][row] for name in _DATA_FIELDS}})
    return items


def collate_items(items: list[PromptItem], uids: list[str], pad_token_id: int) -> Batch:
    """A loader-style prompt batch of ``items`` (left-padded to the longest) under ``uids``."""
    prompts = [TokenizedPrompt(row_id=-1, input_ids=tuple(item["input_ids"]), raw_prompt=item[DataFields.RAW_PROMPT],
                               data_source=item[DataFields.DATA_SOURCE], ground_truth=item[DataFields.GROUND_TRUTH],
                               extra_info=item[DataFields.EXTRA_INFO]) for item in items]
    return collate_prompts(prompts, uids, pad_token_id)


class PromptReplay:
    """Prioritized prompt replay mixed into each step's prompts (see the module docstring).

    Args:
        capacity, alpha: of the buffer (``data.replay``).
        num_replayed: prompts replaced by replayed ones each step (``round(fraction × train_batch_size)``).
        pad_token_id: the loader's pad id.
        seed: sampling seed (combined with the step).
    """

    def __init__(self, capacity: int, alpha: float, num_replayed: int, pad_token_id: int, seed: int) -> None:
        self.buffer: PrioritizedReplay[PromptItem] = PrioritizedReplay(capacity, alpha=alpha, seed=seed)
        self.num_replayed, self.pad_token_id = num_replayed, pad_token_id

    @classmethod
    def from_config(cls, config: TrainConfig, pad_token_id: int) -> Optional["PromptReplay"]:
        replay = config.data.replay
        if not replay.enable:
            return None
        return cls(replay.capacity, replay.alpha, round(replay.fraction * config.data.train_batch_size),
                   pad_token_id, derive_seed(config.trainer.seed, "replay"))

    def mix(self, prompts: Batch, step: int) -> tuple[Batch, dict[str, float]]:
        """``prompts`` with its last ``k`` rows replaced by ``k = min(num_replayed, buffer size)`` drawn prompts."""
        drawn = [item for _, item in self.buffer.sample(self.num_replayed, step)]
        metrics = {"replay/share": len(drawn) / len(prompts), "replay/buffer_size": float(len(self.buffer))}
        if not drawn:
            return prompts, metrics
        kept = len(prompts) - len(drawn)
        uids = list(prompts[Fields.UID][:kept]) + [f"replay-s{step}-{k}" for k in range(len(drawn))]
        return collate_items(prompt_items(prompts)[:kept] + drawn, uids, self.pad_token_id), metrics

    def observe(self, rollout: Batch) -> None:
        """(Re)insert every prompt group of a scored rollout batch, priority = spread of its sequence scores."""
        prompts, group_of_row = prompt_rows(rollout)
        scores = rollout[Fields.TOKEN_LEVEL_SCORES].sum(-1)
        for group, item in enumerate(prompt_items(prompts)):
            spread = group_score_spread(scores[torch.as_tensor(group_of_row == group)].tolist())
            self.buffer.add(item[DataFields.RAW_PROMPT], item, spread)

    def state_dict(self) -> dict[str, Any]:
        return self.buffer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state)
