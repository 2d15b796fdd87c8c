"""Prompt data: file datasets (parquet / JSONL, verl's schema), synthetic tasks, resumable batching, preprocessing.

- :class:`PromptDataset` (:mod:`~hybridrl.data.dataset`) — rows → validated, tokenised prompts, length policy.
- :class:`PromptLoader` / :func:`build_prompt_loaders` (:mod:`~hybridrl.data.loader`) — per-step batches, resume.
- :data:`SYNTHETIC_TASKS` / :class:`ArithmeticTask` (:mod:`~hybridrl.data.synthetic`) — verifiable generated tasks.
- :mod:`~hybridrl.data.preprocess` — ``python -m hybridrl.data.preprocess gsm8k --input ... --output ...``.
- :mod:`~hybridrl.data.partition` — token-balanced partitioning across ranks and micro-batches.
"""

from hybridrl.data.dataset import PromptDataset, PromptOptions, TokenizedPrompt
from hybridrl.data.io import read_rows, write_rows
from hybridrl.data.loader import DataFields, PromptLoader, PromptLoaders, build_prompt_loaders, collate_prompts
from hybridrl.data.records import PromptRecord, record_from_row
from hybridrl.data.sft import SFTExample, encode_sft_examples, sft_examples_from_rows
from hybridrl.data.synthetic import SYNTHETIC_TASKS, ArithmeticTask, build_synthetic_task
from hybridrl.data import tool_arithmetic  # noqa: F401  (registers the tool_arithmetic task)
from hybridrl.data import judge_arithmetic  # noqa: F401  (registers the arithmetic_judge task)
from hybridrl.data import shapes  # noqa: F401  (registers the shapes image task)

__all__ = [
    "SYNTHETIC_TASKS",
    "ArithmeticTask",
    "DataFields",
    "PromptDataset",
    "PromptLoader",
    "PromptLoaders",
    "PromptOptions",
    "PromptRecord",
    "SFTExample",
    "TokenizedPrompt",
    "build_prompt_loaders",
    "build_synthetic_task",
    "collate_prompts",
    "encode_sft_examples",
    "read_rows",
    "record_from_row",
    "sft_examples_from_rows",
    "write_rows",
]
