"""Prompt datasets: rows (files or a synthetic task) → validated records → token ids, length policy applied.

Formatting:

- ``apply_chat_template=True``: chat-message prompts go through the tokenizer's chat template with the generation
  prompt appended (``apply_chat_template(messages, add_generation_prompt=True)``); a plain-text prompt is first
  wrapped as one user message. The rendered text is then tokenised with ``add_special_tokens=False`` — exactly what
  ``apply_chat_template(..., tokenize=True)`` does, since the template already holds any BOS token. A tokenizer
  without a chat template is a ``ValueError``.
- ``apply_chat_template=False`` (base models): a plain-text prompt is tokenised as is, *with* the tokenizer's special
  tokens (BOS where it adds one); chat messages are joined by newlines, contents only.

Length policy (``max_prompt_length``, counted after formatting): with ``filter_overlong_prompts`` longer prompts are
dropped when loading (the count is logged and kept in :attr:`PromptDataset.num_filtered`); otherwise ``truncation``
applies: ``error`` refuses, naming the row and its length; ``left`` keeps the last ``max_prompt_length`` tokens (the
start of a chat prompt — its role header — is cut); ``right`` keeps the first ones (the generation prompt at the end
is cut). ``raw_prompt`` is always the formatted text before truncation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hybridrl.data.chat_roles import check_roles, template_source
from hybridrl.data.images import ImagePrompts
from hybridrl.data.io import SourceRow, read_rows
from hybridrl.data.records import ChatMessages, PromptRecord, check_columns, record_from_row

__all__ = ["TRUNCATION_MODES", "PromptOptions", "TokenizedPrompt", "PromptDataset", "format_prompt", "tokenize_prompts"]

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "left", "right")


@dataclass(frozen=True)
class PromptOptions:
    """How prompts are read and turned into token ids (the prompt-related keys of ``DataConfig``)."""

    prompt_key: str = "prompt"
    max_prompt_length: int = 512
    truncation: str = "error"
    filter_overlong_prompts: bool = True
    apply_chat_template: bool = True
    image_key: str = "images"
    images: Optional[ImagePrompts] = None
    """How the policy reads images (a vision-language model's, :mod:`hybridrl.data.images`); ``None``: text-only."""

    def __post_init__(self) -> None:
        if self.truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation={self.truncation!r}: expected one of {', '.join(TRUNCATION_MODES)}")
        if isinstance(self.max_prompt_length, bool) or not isinstance(self.max_prompt_length, int) \
                or self.max_prompt_length < 1:
            raise ValueError(f"data.max_prompt_length must be a positive int, got {self.max_prompt_length!r}")

    @classmethod
    def from_data_config(cls, config: Any, images: Optional[ImagePrompts] = None) -> PromptOptions:
        """The options of a :class:`~hybridrl.config.schema.DataConfig`; ``images``: the policy's image reader."""
        return cls(config.prompt_key, config.max_prompt_length, config.truncation, config.filter_overlong_prompts,
                   config.apply_chat_template, config.image_key, images)


@dataclass(frozen=True)
class TokenizedPrompt:
    """One prompt ready for batching.

    Attributes:
        row_id: position of the row in the dataset's input, counted before filtering (stable for given inputs).
        input_ids: the prompt's token ids ``[P_i]``, ``P_i <= max_prompt_length``.
        raw_prompt: the formatted prompt text (chat template applied), before truncation.
        data_source, ground_truth, ability, extra_info: from the row (see :class:`PromptRecord`).
        messages: the row's prompt as given (chat messages or text), for a reward model with its own chat template.
        where: the row's location for error messages (``"train.parquet: row 3 (line 4)"``); empty if unknown.
        images: the row's images as given (decoded when a batch is formed); ``input_ids`` hold their image tokens.
    """

    row_id: int
    input_ids: tuple[int, ...]
    raw_prompt: str
    data_source: str
    ground_truth: Any
    ability: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)
    messages: Any = None
    where: str = ""
    images: tuple = ()


def format_prompt(prompt: ChatMessages | str, tokenizer: Any, apply_chat_template: bool, where: str = "prompt") -> str:
    """The text the model sees for ``prompt`` (see the module docstring for the rules); ``where`` labels errors."""
    if not apply_chat_template:
        return prompt if isinstance(prompt, str) else "\n".join(message["content"] for message in prompt)
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    check_roles(template_source(tokenizer), messages, where, "prompt")
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as error:  # jinja errors (e.g. "roles must alternate") raised by the template itself
        raise ValueError(f"{where}: the tokenizer's chat template failed: {type(error).__name__}: {error}") from None


def tokenize_prompts(texts: Sequence[str], tokenizer: Any, apply_chat_template: bool) -> list[list[int]]:
    """Token ids of formatted prompts: no special tokens added to chat-templated text (the template holds them)."""
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=not apply_chat_template)["input_ids"]]


def _tokenized_or_named(texts: Sequence[str], records: Sequence[PromptRecord], tokenizer: Any,
                        apply_chat_template: bool) -> list[list[int]]:
    """:func:`tokenize_prompts`, and when the tokenizer refuses a text (a character it cannot encode and no unknown
    token), the row that holds it named."""
    try:
        return tokenize_prompts(texts, tokenizer, apply_chat_template)
    except Exception:  # the tokenizers library raises its own exception types
        for record, text in zip(records, texts):
            try:
                tokenize_prompts([text], tokenizer, apply_chat_template)
            except Exception as error:
                raise ValueError(f"{record.where}: the tokenizer cannot encode this prompt ({type(error).__name__}: "
                                 f"{error}); remove the characters it does not know, or use a tokenizer with an "
                                 "unknown token") from None
        raise


class PromptDataset(Sequence[TokenizedPrompt]):
    """A list of :class:`TokenizedPrompt` with a name (``train`` / ``val``, used in uids and messages).

    Build with :meth:`from_files`, :meth:`from_rows` or :meth:`from_records`.
    """

    def __init__(self, prompts: Sequence[TokenizedPrompt], *, name: str, num_filtered: int = 0,
                 images: Optional[ImagePrompts] = None) -> None:
        self.prompts = list(prompts)
        self.name = name
        self.num_filtered = num_filtered
        self.images = images
        """The policy's image reader, which decodes a batch's images (``None``: text-only)."""

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: Any) -> Any:
        return self.prompts[index]

    def __repr__(self) -> str:
        return f"PromptDataset(name={self.name!r}, prompts={len(self)}, filtered={self.num_filtered})"

    @classmethod
    def from_files(cls, files: Iterable[str | Path], tokenizer: Any, options: PromptOptions = PromptOptions(),
                   *, name: str = "train") -> PromptDataset:
        """Load, validate and tokenise every row of the given parquet / JSONL files, in order.

        Raises:
            ValueError: naming the file (and row) for any problem in :func:`~hybridrl.data.io.read_rows` or
                :func:`~hybridrl.data.records.record_from_row`, or the row of an over-long prompt.
        """
        files = list(files)
        if not files:
            raise ValueError(f"no data files given for the {name!r} dataset")
        source_rows: list[SourceRow] = []
        for file in files:
            row_file = read_rows(file)
            if row_file.columns is not None:
                check_columns(row_file.columns, options.prompt_key, f"data file {str(row_file.path)!r}")
            source_rows.extend(row_file.rows)
        records = [record_from_row(item.row, item.where, options.prompt_key, options.image_key)
                   for item in source_rows]
        return cls.from_records(records, tokenizer, options, name=name)

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], tokenizer: Any, options: PromptOptions = PromptOptions(),
                  *, name: str = "train", source: str = "rows") -> PromptDataset:
        """Validate and tokenise in-memory rows (e.g. from a synthetic task); ``source`` labels error messages."""
        records = [record_from_row(row, f"{source}: row {index}", options.prompt_key, options.image_key)
                   for index, row in enumerate(rows)]
        if not records:
            raise ValueError(f"{source}: no rows for the {name!r} dataset")
        return cls.from_records(records, tokenizer, options, name=name)

    @classmethod
    def from_records(cls, records: Sequence[PromptRecord], tokenizer: Any, options: PromptOptions = PromptOptions(),
                     *, name: str = "train") -> PromptDataset:
        """Format, tokenise and apply the length policy to validated records."""
        if options.apply_chat_template and getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"data.apply_chat_template=true but the tokenizer ({type(tokenizer).__name__}) has no chat template; "
                "set data.apply_chat_template=false for plain-text prompts, or use a tokenizer with a chat template"
            )
        texts = [format_prompt(_with_image_tokens(record, tokenizer, options), tokenizer, options.apply_chat_template,
                               record.where) for record in records]
        token_ids = _tokenized_or_named(texts, records, tokenizer, options.apply_chat_template)
        prompts = []
        for row_id, (record, text, ids) in enumerate(zip(records, texts, token_ids)):
            if options.images is not None:  # one pad per merged patch, counted from each image's size
                ids = options.images.expanded(ids, options.images.image_tokens(record.images, record.where),
                                              record.where)
            kept = _apply_length_policy(ids, record.where, options, has_images=bool(record.images))
            if kept is not None:
                prompts.append(TokenizedPrompt(row_id, tuple(kept), text, record.data_source, record.ground_truth,
                                               record.ability, record.extra_info, record.prompt, record.where,
                                               record.images))
        num_filtered = len(records) - len(prompts)
        if num_filtered:
            logger.warning("%s dataset: dropped %d of %d prompts longer than data.max_prompt_length=%d tokens "
                           "(data.filter_overlong_prompts=true)", name, num_filtered, len(records),
                           options.max_prompt_length)
        if not prompts:
            raise ValueError(f"every one of the {len(records)} prompts of the {name!r} dataset is longer than "
                             f"data.max_prompt_length={options.max_prompt_length} tokens; nothing is left")
        return cls(prompts, name=name, num_filtered=num_filtered, images=options.images)


def _with_image_tokens(record: PromptRecord, tokenizer: Any, options: PromptOptions) -> Any:
    """The record's prompt with its ``<image>`` placeholders as the policy's vision tokens; a row with images for a
    text-only policy is refused, named."""
    if not record.images:
        return record.prompt
    if options.images is None:
        raise ValueError(f"{record.where}: the row has {len(record.images)} image(s) ({options.image_key!r}), but the "
                         "policy (model.path) is a text-only model; train a vision-language model (Qwen2-VL-class) "
                         "on image rows, or drop the images")
    return options.images.with_placeholders(record.prompt, tokenizer)


def _apply_length_policy(ids: list[int], where: str, options: PromptOptions,
                         has_images: bool = False) -> list[int] | None:
    """``ids`` within ``max_prompt_length``: kept, truncated, ``None`` (filtered out), or a ``ValueError``. A prompt
    with images is never truncated (it would cut image tokens from their image)."""
    limit = options.max_prompt_length
    if len(ids) <= limit:
        return ids
    if options.filter_overlong_prompts:
        return None
    if has_images:
        raise ValueError(f"{where}: the prompt with its image tokens is {len(ids)} tokens, longer than "
                         f"data.max_prompt_length={limit}; raise the limit, set data.filter_overlong_prompts=true, or "
                         "shrink the images (the image processor's max_pixels): prompts with images are not truncated")
    if options.truncation == "left":
        return ids[-limit:]
    if options.truncation == "right":
        return ids[:limit]
    raise ValueError(
        f"{where}: the prompt is {len(ids)} tokens, longer than data.max_prompt_length={limit} "
        "(data.truncation=error); raise the limit, set data.filter_overlong_prompts=true to drop such prompts, "
        "or data.truncation=left/right"
    )
