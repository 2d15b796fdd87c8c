"""Unpaired preference rows for KTO (``hybridrl dpo loss.type=kto``): rows → labelled completions (errors naming
file and row) → KTO rows in the pair Batch layout.

A row (parquet or JSONL) is TRL's unpaired layout — one completion, desirable or not::

    {"prompt": [{"role": "user", "content": "2+2?"}], "completion": "4", "label": true}
    {"prompt": [{"role": "user", "content": "2+2?"}], "completion": [{"role": "assistant", "content": "5"}],
     "label": false}

``prompt`` is chat messages or text; ``completion`` text, or one assistant message; ``label`` a boolean (``true``:
desirable; 1 and 0 are read as true and false). A paired row (``chosen`` / ``rejected``, any layout ``hybridrl.data.preference``
reads) gives two completions, its chosen one desirable and its rejected one not, as TRL unpairs preference data.

KTO's reference point ``z₀`` estimates KL(π‖π_ref) from *mismatched* (prompt, completion) pairs. Each KTO row
carries one: its ``chosen`` side is (prompt, completion), its ``rejected`` side (prompt, the KL completion) — the
completion of the row before it whose prompt differs, in a seeded random order of the rows (TRL rotates completions
by one within a batch, in data order: there a pair's rejected side always lends its completion to the next pair's
chosen side). The pairing is fixed when the data are read, so it is the same however a step is cut, and the
reference scores both sides once with the rest (``loss.reference_log_probs=precompute``).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from hybridrl.data.io import SourceRow, read_rows
from hybridrl.data.preference import PreferencePair, _response, pairs_from_row, prompt_key
from hybridrl.data.records import check_prompt

__all__ = ["LabelledCompletion", "KTOPair", "completions_from_row", "read_labelled_completions", "kto_pairs",
           "unpaired", "label_counts"]


@dataclass(frozen=True)
class LabelledCompletion:
    """One completion of ``prompt`` (messages or text), ``desirable`` or not."""

    prompt: Any
    completion: str
    desirable: bool
    where: str = "<memory>"

    def prompt_key(self) -> str:
        return prompt_key(self.prompt)


@dataclass(frozen=True)
class KTOPair(PreferencePair):
    """A KTO row in the pair layout: ``chosen`` is the completion (``desirable`` or not), ``rejected`` the KL
    completion (another prompt's completion, for ``z₀``)."""

    desirable: bool = True


def completions_from_row(source: SourceRow) -> list[LabelledCompletion]:
    """The labelled completions of one row (module docstring); ``ValueError`` naming the row."""
    row, where = source.row, source.where
    if "chosen" in row or "rejected" in row or "responses" in row:
        return unpaired(pairs_from_row(source))
    missing = [key for key in ("prompt", "completion", "label") if key not in row]
    if missing:
        raise ValueError(f"{where}: missing column(s) {missing}: a KTO row needs 'prompt', 'completion' and 'label' "
                         f"(true: desirable, false: undesirable), or 'chosen' and 'rejected' (columns: {sorted(row)})")
    label = row["label"]
    if isinstance(label, int) and not isinstance(label, bool) and label in (0, 1):
        label = bool(label)
    if not isinstance(label, bool):
        raise ValueError(f"{where}: 'label' must be true (desirable) or false (undesirable), got {label!r}")
    prompt = check_prompt(row["prompt"], where, "prompt")
    completion = row["completion"]
    if not isinstance(completion, str):
        messages = check_prompt(completion, where, "completion")
        if isinstance(messages, str) or len(messages) != 1 or messages[0]["role"] != "assistant":
            raise ValueError(f"{where}: 'completion' must be text, or one assistant message (TRL's conversational "
                             "layout)")
        completion = messages[0]["content"]
    return [LabelledCompletion(prompt, _response({"completion": completion}, "completion", where), label, where)]


def unpaired(pairs: Iterable[PreferencePair]) -> list[LabelledCompletion]:
    """Each pair's chosen response as a desirable completion and its rejected one as an undesirable one."""
    return [completion for pair in pairs for completion in (
        LabelledCompletion(pair.prompt, pair.chosen, True, pair.where),
        LabelledCompletion(pair.prompt, pair.rejected, False, pair.where))]


def read_labelled_completions(paths: Sequence[str]) -> list[LabelledCompletion]:
    """All labelled completions of the parquet/JSONL files ``paths``; an error names the file and row."""
    completions = [item for path in paths for source in read_rows(path).rows for item in completions_from_row(source)]
    if not completions:
        raise ValueError(f"no KTO rows in {list(paths)}")
    return completions


def kto_pairs(completions: Sequence[LabelledCompletion], what: str = "the KTO data",
              seed: Optional[int] = None) -> list[KTOPair]:
    """One :class:`KTOPair` per completion. Its KL completion: ``seed=None``, that of the nearest earlier row in data
    order (cyclically) with another prompt — TRL's rotation by one, for data laid out as TRL batches it; a ``seed``,
    the same over a seeded permutation of the rows, so that neighbours in the file (a pair's two sides, a prompt's
    several completions) do not all lend the same kind of completion. ``ValueError`` when every row has the same
    prompt (no mismatched pair exists)."""
    keys = [item.prompt_key() for item in completions]
    if len(set(keys)) < 2:
        raise ValueError(f"{what}: KTO needs completions of at least two different prompts (its KL estimate pairs "
                         f"each prompt with another prompt's completion); found {len(set(keys))}")

    order = list(range(len(completions)))
    if seed is not None:
        random.Random(f"hybridrl/kto/kl/{seed}").shuffle(order)
    partner = {}
    for position, index in enumerate(order):
        earlier = (order[(position - step) % len(order)] for step in range(1, len(order)))
        partner[index] = next(other for other in earlier if keys[other] != keys[index])
    return [KTOPair(item.prompt, item.completion, completions[partner[index]].completion, 0.0, item.where,
                    desirable=item.desirable) for index, item in enumerate(completions)]


def check_both_labels(completions: Sequence[LabelledCompletion], what: str) -> None:
    """``ValueError`` when every completion of the training data carries one label: KTO weighs desirable against
    undesirable completions (its reward gap and held-out ranking compare the two), so it would learn no preference
    and report a gap of 0."""
    labels = {item.desirable for item in completions}
    if len(labels) < 2:
        label = "desirable" if labels == {True} else "undesirable"
        raise ValueError(f"{what}: all {len(completions)} completions are {label}: KTO weighs desirable against "
                         "undesirable completions, so with one label it learns no preference (its reward gap reads "
                         "0); add completions labelled the other way")


def label_counts(rows: Sequence[KTOPair]) -> tuple[int, int]:
    """``(desirable, undesirable)`` rows."""
    desirable = sum(row.desirable for row in rows)
    return desirable, len(rows) - desirable
