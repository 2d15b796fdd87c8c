"""``hybridrl eval``'s output directory: the per-prompt records of a long evaluation, appended a batch at a time so an
interrupted evaluation resumes where it stopped, and the figures computed from them.

``<output>/samples.jsonl`` — one line per prompt: ``batch``, ``row_id``, ``data_source``, ``prompt``,
``ground_truth``, ``val`` (the validation pass's response: ``response``, ``score``, ``correct``, ``answer``,
``tokens``) and ``samples`` (the ``n`` sampled responses, same fields). ``<output>/settings.json`` — what the records
depend on (model, test set, sampling); a resumed evaluation must match it. ``<output>/results.json`` — the figures.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

from hybridrl.rewards.pass_at_k import SampleJudgement, majority_correct, pass_at_k

SAMPLES_FILE = "samples.jsonl"
SETTINGS_FILE = "settings.json"
RESULTS_FILE = "results.json"
ALL_SOURCES = "all"


class EvalRecords:
    """The records of one evaluation in ``output_dir`` (see the module docstring).

    Args:
        output_dir: created if missing.
        settings: what the records depend on (JSON-able). Records left by an evaluation with other settings are
            refused (``ValueError`` naming the keys that differ) unless ``overwrite``.
        overwrite: start afresh, dropping earlier records.
    """

    def __init__(self, output_dir: Path, settings: dict[str, Any], overwrite: bool = False) -> None:
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.samples_path = self.output_dir / SAMPLES_FILE
        settings_path = self.output_dir / SETTINGS_FILE
        if overwrite or not settings_path.is_file():
            self.samples_path.unlink(missing_ok=True)
            (self.output_dir / RESULTS_FILE).unlink(missing_ok=True)
        else:
            _check_same_settings(json.loads(settings_path.read_text()), settings, self.output_dir)
        settings_path.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
        self.batches: dict[int, list[dict[str, Any]]] = self._read_complete_batches(settings["batch_sizes"])

    def _read_complete_batches(self, batch_sizes: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
        """The batches written whole (a batch cut short by a crash is generated again), and the file rewritten to
        hold just them."""
        rows_by_batch: dict[int, list[dict[str, Any]]] = defaultdict(list)
        if self.samples_path.is_file():
            for line in self.samples_path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # the last line of a write a crash interrupted
                    break
                rows_by_batch[int(row["batch"])].append(row)
        complete = {index: rows for index, rows in rows_by_batch.items()
                    if index < len(batch_sizes) and len(rows) == batch_sizes[index]}
        with self.samples_path.open("w", encoding="utf-8") as file:
            for index in sorted(complete):
                file.writelines(json.dumps(row) + "\n" for row in complete[index])
        return complete

    def append(self, batch_index: int, rows: list[dict[str, Any]]) -> None:
        """Write a finished batch's rows (one write, flushed) and keep them."""
        with self.samples_path.open("a", encoding="utf-8") as file:
            file.write("".join(json.dumps(row) + "\n" for row in rows))
            file.flush()
        self.batches[batch_index] = rows

    def rows(self) -> list[dict[str, Any]]:
        """Every record, in test-set order."""
        return [row for index in sorted(self.batches) for row in self.batches[index]]

    def write_results(self, results: dict[str, Any]) -> Path:
        path = self.output_dir / RESULTS_FILE
        path.write_text(json.dumps(results, indent=2) + "\n")
        return path


def _check_same_settings(saved: dict[str, Any], current: dict[str, Any], output_dir: Path) -> None:
    differ = sorted(key for key in set(saved) | set(current) if saved.get(key) != current.get(key))
    if differ:
        detail = "; ".join(f"{key}: {saved.get(key)!r} then, {current.get(key)!r} now" for key in differ[:4])
        raise ValueError(f"--output {output_dir} holds an evaluation with other settings ({detail}); resume it with "
                         "the same settings, or pass --overwrite, or choose another --output")


def judged_row(response: str, score: float, correct: float, answer: str, tokens: int) -> dict[str, Any]:
    """One response as a record holds it."""
    return {"response": response, "score": float(score), "correct": bool(correct), "answer": answer,
            "tokens": int(tokens)}


def json_value(value: Any) -> Any:
    """``value`` if JSON can hold it, else its ``repr`` (a ground truth may be any Python value)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def summarise(rows: Iterable[dict[str, Any]], ks: Sequence[int]) -> dict[str, dict[str, float]]:
    """Figures per data source and over all (``"all"``): ``prompts``, ``accuracy`` and ``score`` of the validation
    pass (greedy by default: pass@1), its mean ``response_tokens``; with sampled responses also
    ``sampled_accuracy`` (their mean), ``pass@k`` and ``maj@k`` for each ``k`` in ``ks``."""
    by_source: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_source[str(row["data_source"])].append(row)
        by_source[ALL_SOURCES].append(row)
    return {source: _figures(records, ks) for source, records in sorted(by_source.items(),
                                                                        key=lambda item: item[0] == ALL_SOURCES)}


def _figures(rows: list[dict[str, Any]], ks: Sequence[int]) -> dict[str, float]:
    val = [response for row in rows for response in row["val"]]
    figures = {"prompts": float(len(rows)), "accuracy": _mean(float(item["correct"]) for item in val),
               "score": _mean(item["score"] for item in val), "response_tokens": _mean(item["tokens"] for item in val)}
    if rows and rows[0]["samples"]:
        figures["sampled_accuracy"] = _mean(float(item["correct"]) for row in rows for item in row["samples"])
        for k in ks:
            figures[f"pass@{k}"] = _mean(pass_at_k(len(row["samples"]), sum(item["correct"] for item in
                                                                           row["samples"]), k) for row in rows)
        for k in ks:
            figures[f"maj@{k}"] = _mean(float(majority_correct(
                [SampleJudgement(item["answer"], item["correct"]) for item in row["samples"]], k)) for row in rows)
    return figures


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else math.nan


def format_table(figures: dict[str, dict[str, float]], val_is_greedy: bool) -> str:
    """The figures as a plain-text table, one line per data source (``all`` last)."""
    columns = [key for key in next(iter(figures.values()), {}) if key != "prompts"]
    labels = {"accuracy": "pass@1 (greedy)" if val_is_greedy else "accuracy (val_kwargs)", "score": "score",
              "response_tokens": "tokens", "sampled_accuracy": "mean@n"}
    header = ["data source", "prompts", *(labels.get(key, key) for key in columns)]
    lines = [[source, str(int(values["prompts"])), *(_format(values[key], key) for key in columns)]
             for source, values in figures.items()]
    widths = [max(len(row[index]) for row in [header, *lines]) for index in range(len(header))]
    render = lambda row: "  ".join(cell.ljust(width) if index == 0 else cell.rjust(width)  # noqa: E731
                                   for index, (cell, width) in enumerate(zip(row, widths)))
    return "\n".join([render(header), "  ".join("-" * width for width in widths), *map(render, lines)])


def _format(value: float, key: str) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.1f}" if key == "response_tokens" else f"{100 * value:.1f} %" if key != "score" else f"{value:.3f}"
