"""``hybridrl eval``: a model on a test set through the trainer's own rollout engines and scorers.

Per batch of prompts (``data.val_batch_size``, as validation batches them): the validation pass — the sampling of
``rollout.val_kwargs`` (greedy by default), the same call and the same scorer as the trainer's validation, so a run's
``val/accuracy`` comes out again — then, with ``--n N > 1``, ``N`` sampled responses per prompt (``rollout``'s
temperature unless ``--temperature``), seeded by the batch's position so a resumed evaluation samples what an
uninterrupted one would. Records go to ``samples.jsonl`` a batch at a time (``eval_records``); pass@k and maj@k
(``rewards/pass_at_k``) are computed from them at the end.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from hybridrl.config.schema import TrainConfig
from hybridrl.data.dataset import PromptDataset
from hybridrl.data.loader import DataFields, PromptLoader
from hybridrl.modeling.model_builder import load_tokenizer
from hybridrl.protocol import Batch, Fields
from hybridrl.rewards.pass_at_k import check_ks
from hybridrl.rewards.scorer import build_reward_scorer
from hybridrl.rollout.base import SamplingParams
from hybridrl.runtime import start_ray
from hybridrl.trainers.eval_records import EvalRecords, format_table, json_value, judged_row, summarise
from hybridrl.trainers.evaluation import Scoring
from hybridrl.replicas import Generators, role_pools, start_generators
from hybridrl.trainers.generation import Generation
from hybridrl.utils.seeding import derive_seed

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalSettings:
    """How many samples per prompt (``n``; 1: the validation pass only), which ``ks`` to report pass@k / maj@k for
    (default: 1 and ``n``), and the sampled pass's ``temperature`` / ``top_p`` (default: ``rollout``'s)."""

    n: int = 1
    ks: tuple[int, ...] = ()
    temperature: Optional[float] = None
    top_p: Optional[float] = None

    def checked(self) -> "EvalSettings":
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"--n={self.n}: must be a positive number of samples per prompt")
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"--temperature={self.temperature}: must be > 0 (the validation pass is the greedy one)")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p={self.top_p}: must be in (0, 1]")
        if self.n == 1 and any(k != 1 for k in self.ks):
            raise ValueError(f"--k {list(self.ks)} needs --n samples per prompt of at least the largest k "
                             "(--n is 1: only the validation pass runs)")
        ks = tuple(check_ks(self.ks or ((1, self.n) if self.n > 1 else ()), self.n)) if self.n > 1 else ()
        return EvalSettings(self.n, ks, self.temperature, self.top_p)


@dataclass
class EvalReport:
    """What an evaluation found: ``figures`` per data source (and ``all``), the output files, the wall time."""

    figures: dict[str, dict[str, float]]
    results_path: Path
    samples_path: Path
    val_is_greedy: bool
    seconds: float

    def table(self) -> str:
        return format_table(self.figures, self.val_is_greedy)


class Evaluator:
    """Evaluates ``config.model.path`` on ``dataset``, writing to ``output_dir`` (see the module docstring)."""

    def __init__(self, config: TrainConfig, dataset: PromptDataset, settings: EvalSettings, output_dir: Path, *,
                 description: str = "", overwrite: bool = False, progress: bool = True) -> None:
        self.config, self.dataset, self.settings = config, dataset, settings.checked()
        self.description, self.progress = description or config.model.path, progress
        self.val_params = SamplingParams.for_validation(config.rollout, config.data.max_response_length,
                                                        seed=config.trainer.seed)
        self.tokenizer = load_tokenizer(config.model)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.batch_size = config.data.val_batch_size or config.data.train_batch_size
        self.loader = PromptLoader(dataset, self.batch_size, pad_token_id=pad, shuffle=False, drop_last=False)
        sizes = [min(self.batch_size, len(dataset) - start) for start in range(0, len(dataset), self.batch_size)]
        self.records = EvalRecords(output_dir, self._settings_header(sizes), overwrite=overwrite)

    def _settings_header(self, batch_sizes: list[int]) -> dict[str, Any]:
        sampled = self.sampled_params(0)
        return {"model": str(Path(self.config.model.path).resolve()), "test_set": self.dataset.name,
                "prompts": [prompt.row_id for prompt in self.dataset], "batch_sizes": batch_sizes,
                "val_sampling": asdict(self.val_params), "n": self.settings.n,
                "sampling": asdict(sampled) if sampled is not None else None, "dtype": self.config.model.dtype,
                "rollout": self.config.rollout.name}

    def sampled_params(self, batch_index: int) -> Optional[SamplingParams]:
        """The sampled pass's settings for batch ``batch_index`` (``None`` with ``n == 1``)."""
        if self.settings.n == 1:
            return None
        rollout = self.config.rollout
        return SamplingParams(n=self.settings.n, max_new_tokens=self.config.data.max_response_length, do_sample=True,
                              temperature=self.settings.temperature or rollout.temperature,
                              top_p=self.settings.top_p or rollout.top_p, top_k=rollout.top_k,
                              seed=derive_seed(self.config.trainer.seed, "eval", batch_index))

    def run(self) -> EvalReport:
        started = time.perf_counter()
        pending = [index for index in range(len(self.loader)) if index not in self.records.batches]
        if len(pending) < len(self.loader):
            logger.info("resuming: %d of %d batches already evaluated in %s", len(self.loader) - len(pending),
                        len(self.loader), self.records.output_dir)
        if pending:
            self._generate(pending)
        rows = self.records.rows()
        figures = summarise(rows, self.settings.ks)
        val_is_greedy = not self.val_params.do_sample and self.val_params.n == 1
        results = {"model": self.description, "test_set": self.dataset.name, "settings": asdict(self.settings),
                   "val_sampling": asdict(self.val_params), "figures": figures}
        results_path = self.records.write_results(results)
        return EvalReport(figures, results_path, self.records.samples_path, val_is_greedy,
                          time.perf_counter() - started)

    def _generate(self, pending: list[int]) -> None:
        config = self.config
        with start_ray(config.trainer.ray) as runtime, build_reward_scorer(config.custom_reward_function) as scorer:
            pools = role_pools(config)
            pools.create(runtime)
            generators: Optional[Generators] = None
            try:
                generators = start_generators(config, pools, total_steps=1, with_reference=False)
                generation = Generation(generators.replicas, generators.transfer)
                if config.rollout.load_format == "dummy":  # the engines start random: bring the model's weights in
                    generation.sync_weights(0)
                self._batches(generation, Scoring(scorer, self.tokenizer), pending)
            finally:
                if generators is not None:
                    generators.shutdown()
                pools.release()

    def _batches(self, generation: Generation, scoring: Scoring, pending: Sequence[int]) -> None:
        bar = _Progress(len(pending), f"eval {self.dataset.name}", enabled=self.progress)
        right = total = 0.0
        try:
            for index, prompts in enumerate(self.loader):
                if index not in pending:
                    continue
                rows = self._evaluate_batch(generation, scoring, prompts, index)
                self.records.append(index, rows)
                right += sum(response["correct"] for row in rows for response in row["val"])
                total += sum(len(row["val"]) for row in rows)
                bar.advance(f"accuracy {right / max(total, 1):.3f}")
        finally:
            bar.close()

    def _evaluate_batch(self, generation: Generation, scoring: Scoring, prompts: Batch,
                        index: int) -> list[dict[str, Any]]:
        """The records of one batch: its validation pass and, with ``n > 1``, its sampled pass."""
        val = _judged(generation.generate(prompts, self.val_params), scoring, self.val_params.n)
        params = self.sampled_params(index)
        sampled = _judged(generation.generate(prompts, params), scoring, params.n) if params else None
        first = index * self.batch_size
        return [{"batch": index, "row_id": self.dataset[first + row].row_id, "data_source": str(source),
                 "prompt": prompt, "ground_truth": json_value(truth), "val": val[row],
                 "samples": sampled[row] if sampled else []}
                for row, (source, prompt, truth) in enumerate(zip(
                    prompts[DataFields.DATA_SOURCE], prompts[DataFields.RAW_PROMPT], prompts[DataFields.GROUND_TRUTH]))]


def _judged(rows: Batch, scoring: Scoring, n: int) -> list[list[dict[str, Any]]]:
    """Per prompt, its ``n`` responses (consecutive rows) as records."""
    judged = scoring.judge_rows(rows)
    tokens = rows[Fields.RESPONSE_MASK].sum(-1).tolist()
    records = [judged_row(text, score, right, answer, length) for text, score, right, answer, length in
               zip(judged.texts, judged.scores.tolist(), judged.correct, judged.answers, tokens)]
    return [records[start:start + n] for start in range(0, len(records), n)]


class _Progress:
    """A rich progress bar over the batches on stderr (nothing when disabled)."""

    def __init__(self, total: int, description: str, enabled: bool) -> None:
        self._bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[figures]}"),
                                 console=Console(file=sys.stderr))
            self._task = self._bar.add_task(description, total=total, figures="")
            self._bar.start()

    def advance(self, figures: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=1, figures=figures)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
