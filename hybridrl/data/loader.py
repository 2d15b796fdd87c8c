"""Batches of prompts per training step, with a stateful order that resumes exactly.

:class:`PromptLoader` yields one :class:`~hybridrl.protocol.Batch` of ``batch_size`` prompts per step:

- tensors ``input_ids`` ``[B, P]`` (int64) and ``attention_mask`` ``[B, P]`` (int64, 1 = real token). Prompts are
  **left-padded to the longest prompt in the batch** (not to ``max_prompt_length``): generation continues right
  after the last prompt token in every row, and short-prompt batches do not pay for padding. ``P`` therefore
  varies from batch to batch; it never exceeds ``max_prompt_length``.
- non-tensors (one per prompt): ``uid`` (see below), ``data_source``, ``ground_truth``, ``extra_info``,
  ``raw_prompt`` (the formatted prompt text) and ``messages`` (the prompt as given) — names in :class:`DataFields`.

``uid`` is ``"<dataset name>-<row id>-e<epoch>"``: unique per prompt row and epoch, deterministic (so a resumed run
produces the same uids), and the key that groups the ``rollout.n`` responses of one prompt.

Order and epochs: each epoch visits every prompt once, in a fresh order when ``shuffle`` (a permutation drawn from
``random.Random`` seeded by ``(seed, epoch)`` — stable across Python versions, and needing no generator state to
resume). With ``drop_last`` (training) an epoch has ``len(dataset) // batch_size`` steps and the remainder is not
seen *that* epoch (a different remainder each shuffled epoch), so every step has exactly ``batch_size`` prompts —
the batch-size identities of the trainer rely on it; a dataset smaller than one batch is refused. Without
``drop_last`` (validation) the last batch is smaller and nothing is skipped.

Iteration and resume: ``iter(loader)`` yields the **remaining** batches of the current epoch, then the loader moves
to the next epoch — so ``for batch in loader`` inside an epoch loop, or ``next(iter(loader))`` once per step, both
walk the same sequence (use one iterator at a time). :meth:`PromptLoader.state_dict` is
``(epoch, batches consumed in it)``, updated as each batch is yielded. After the last batch of an epoch the state
already reads ``(epoch + 1, 0)``, so a run that stops and resumes exactly at an epoch boundary continues with the
next epoch's batches — never with an empty epoch.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Optional

import torch

from hybridrl.data.dataset import PromptDataset, PromptOptions, TokenizedPrompt
from hybridrl.data.images import ImagePrompts
from hybridrl.data.synthetic import build_synthetic_task
from hybridrl.protocol import Batch, Fields

__all__ = ["DataFields", "PromptLoader", "PromptLoaders", "collate_prompts", "build_prompt_loaders",
           "build_prompt_datasets"]


class DataFields:
    """Names of the non-tensor fields a prompt batch carries (besides :attr:`Fields.UID`)."""

    DATA_SOURCE = "data_source"
    GROUND_TRUTH = "ground_truth"
    EXTRA_INFO = "extra_info"
    RAW_PROMPT = "raw_prompt"
    MESSAGES = "messages"


def collate_prompts(prompts: Sequence[TokenizedPrompt], uids: Sequence[str], pad_token_id: int,
                    images: Optional[ImagePrompts] = None) -> Batch:
    """A prompt batch: ``input_ids``/``attention_mask`` ``[B, P]`` left-padded to the longest prompt, plus
    the non-tensor fields (see the module docstring); with ``images`` (a vision-language policy's reader) and a row
    that has images, ``multi_modal_inputs`` too (:mod:`hybridrl.modeling.multimodal`)."""
    length = max(len(prompt.input_ids) for prompt in prompts)
    input_ids = torch.full((len(prompts), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), length), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        size = len(prompt.input_ids)
        input_ids[row, length - size:] = torch.tensor(prompt.input_ids, dtype=torch.long)
        attention_mask[row, length - size:] = 1
    vision = {}
    if images is not None:  # on every batch of an image reader, so that batches concatenate (None: a text row)
        vision = {Fields.MULTI_MODAL_INPUTS: [images.vision_inputs(prompt.images, prompt.where) for prompt in prompts]}
    return Batch(
        tensors={Fields.INPUT_IDS: input_ids, Fields.ATTENTION_MASK: attention_mask},
        non_tensors={**vision,
            Fields.UID: list(uids),
            DataFields.DATA_SOURCE: [prompt.data_source for prompt in prompts],
            DataFields.GROUND_TRUTH: [prompt.ground_truth for prompt in prompts],
            DataFields.EXTRA_INFO: [prompt.extra_info for prompt in prompts],
            DataFields.RAW_PROMPT: [prompt.raw_prompt for prompt in prompts],
            DataFields.MESSAGES: [prompt.messages for prompt in prompts],
        },
    )


class PromptLoader:
    """Stateful, resumable batches of a :class:`PromptDataset` (see the module docstring).

    Args:
        dataset: the prompts.
        batch_size: prompts per batch (``data.train_batch_size`` / ``data.val_batch_size``).
        pad_token_id: id used for left padding (masked out by ``attention_mask``).
        shuffle: a new seeded order every epoch (``data.shuffle``); else dataset order.
        seed: seed of the order (``data.seed``).
        drop_last: skip the last incomplete batch of each epoch (training) or keep it (validation).
    """

    def __init__(self, dataset: PromptDataset, batch_size: int, *, pad_token_id: int, shuffle: bool = True,
                 seed: int = 1, drop_last: bool = True) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if drop_last and len(dataset) < batch_size:
            raise ValueError(
                f"the {dataset.name!r} dataset has {len(dataset)} prompts (after filtering), fewer than one batch of "
                f"{batch_size} (data.{dataset.name}_batch_size); with drop_last an epoch would have no step"
            )
        self.dataset, self.batch_size, self.pad_token_id = dataset, batch_size, pad_token_id
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self._epoch, self._position = 0, 0
        self._cached_order: tuple[int, list[int]] | None = None  # (epoch, order): one shuffle per epoch, not per step

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch: ``len(dataset) // batch_size`` with ``drop_last``, else rounded up."""
        full, remainder = divmod(len(self.dataset), self.batch_size)
        return full + (1 if remainder and not self.drop_last else 0)

    def __len__(self) -> int:
        return self.steps_per_epoch

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from (0-based)."""
        return self._epoch

    @property
    def position(self) -> int:
        """Batches already yielded from the current epoch."""
        return self._position

    def epoch_order(self, epoch: int) -> list[int]:
        """Dataset indices in the order epoch ``epoch`` visits them (a pure function of ``seed`` and ``epoch``)."""
        if self._cached_order is not None and self._cached_order[0] == epoch:
            return list(self._cached_order[1])
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(f"hybridrl/prompt-order/{self.seed}/{epoch}").shuffle(order)
        self._cached_order = (epoch, order)
        return list(order)

    def __iter__(self) -> Iterator[Batch]:
        """The remaining batches of the current epoch; afterwards the loader stands at the next epoch's start."""
        epoch, start = self._epoch, self._position
        order = self.epoch_order(epoch)
        for step in range(start, self.steps_per_epoch):
            indices = order[step * self.batch_size:(step + 1) * self.batch_size]
            batch = self._collate(indices, epoch)
            self._advance()
            yield batch

    def _collate(self, indices: list[int], epoch: int) -> Batch:
        prompts = [self.dataset[index] for index in indices]
        uids = [f"{self.dataset.name}-{prompt.row_id}-e{epoch}" for prompt in prompts]
        return collate_prompts(prompts, uids, self.pad_token_id, self.dataset.images)

    def _advance(self) -> None:
        self._position += 1
        if self._position >= self.steps_per_epoch:
            self._epoch, self._position = self._epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands, plus what must match on resume (dataset size, batch size, order settings)."""
        return {"epoch": self._epoch, "position": self._position, "num_prompts": len(self.dataset),
                "batch_size": self.batch_size, "seed": self.seed, "shuffle": self.shuffle, "drop_last": self.drop_last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next batch is the one the saved run would have seen next.

        Raises:
            ValueError: naming the key if the state is incomplete, out of range, or was saved with a different
                dataset size, batch size, seed, shuffle or drop_last (the order would then silently differ).
        """
        current = self.state_dict()
        missing = sorted(set(current) - set(state))
        if missing:
            raise ValueError(f"prompt loader state: missing key(s) {missing}; got keys {sorted(state)}")
        for key in ("num_prompts", "batch_size", "seed", "shuffle", "drop_last"):
            if state[key] != current[key]:
                raise ValueError(f"prompt loader state: {key}={state[key]!r} when saved but {current[key]!r} now; "
                                 "resuming would not reproduce the data order")
        epoch, position = state["epoch"], state["position"]
        if epoch < 0 or not 0 <= position <= self.steps_per_epoch:
            raise ValueError(f"prompt loader state: epoch={epoch}, position={position} out of range "
                             f"(steps_per_epoch={self.steps_per_epoch})")
        self._epoch, self._position = epoch, position
        if position == self.steps_per_epoch:  # a state saved at an epoch's end means: start the next epoch
            self._epoch, self._position = epoch + 1, 0


class PromptLoaders(NamedTuple):
    """The loaders of one run: ``train``, and ``val`` (``None`` when there is no validation data)."""

    train: PromptLoader
    val: PromptLoader | None


def build_prompt_datasets(data_config: Any, tokenizer: Any,
                          images: Optional[ImagePrompts] = None) -> tuple[PromptDataset, PromptDataset | None]:
    """The train and validation datasets of a ``DataConfig``: from ``train_files``/``val_files``, or from
    ``synthetic_task`` (its training stream and held-out set). ``images``: a vision-language policy's image reader."""
    options = PromptOptions.from_data_config(data_config, images)
    if data_config.synthetic_task is not None:
        for key in ("train_files", "val_files"):
            if getattr(data_config, key):
                raise ValueError(f"data.synthetic_task={data_config.synthetic_task!r} and data.{key} are both set; "
                                 "choose one source of prompts")
        task = build_synthetic_task(data_config.synthetic_task, seed=data_config.seed,
                                    **dict(data_config.synthetic_task_kwargs or {}))
        train = PromptDataset.from_rows(task.train_rows(), tokenizer, options, name="train",
                                        source=f"synthetic task {data_config.synthetic_task!r} (train)")
        val = PromptDataset.from_rows(task.validation_rows(), tokenizer, options, name="val",
                                      source=f"synthetic task {data_config.synthetic_task!r} (val)")
        return train, val
    if not data_config.train_files:
        raise ValueError("data.train_files is empty and data.synthetic_task is not set: no training prompts")
    train = PromptDataset.from_files(data_config.train_files, tokenizer, options, name="train")
    val = PromptDataset.from_files(data_config.val_files, tokenizer, options, name="val") \
        if data_config.val_files else None
    return train, val


def build_prompt_loaders(data_config: Any, tokenizer: Any, images: Optional[ImagePrompts] = None) -> PromptLoaders:
    """Train and validation loaders from a :class:`~hybridrl.config.schema.DataConfig`.

    Training: ``train_batch_size`` prompts per step (``gen_batch_size`` per generation batch with dynamic
    sampling), ``shuffle`` with ``seed``, ``drop_last``. Validation: dataset
    order, ``val_batch_size`` prompts per batch (``null``: ``train_batch_size``), nothing dropped.
    The pad id is the tokenizer's pad token, or its EOS token when it has none (padding is masked either way).
    """
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_token_id is None:
        raise ValueError(f"the tokenizer ({type(tokenizer).__name__}) has neither a pad nor an eos token to pad with")
    train_set, val_set = build_prompt_datasets(data_config, tokenizer, images)
    generation_batch = getattr(data_config, "gen_batch_size", None) or data_config.train_batch_size
    train = PromptLoader(train_set, generation_batch, pad_token_id=pad_token_id,
                         shuffle=data_config.shuffle, seed=data_config.seed, drop_last=True)
    val = None
    if val_set is not None:
        val = PromptLoader(val_set, data_config.val_batch_size or data_config.train_batch_size, pad_token_id=pad_token_id,
                           shuffle=False, seed=data_config.seed, drop_last=False)
    return PromptLoaders(train, val)
