"""End-of-run outputs: a PNG of the learning curves and a one-screen summary, from the run's per-step metric rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from hybridrl.utils.tracking import read_metrics

CURVES = (
    ("critic/score/mean", "training score (mean)"),
    ("val/accuracy", "held-out accuracy"),
    ("actor/pg_loss", "policy loss"),
    ("actor/entropy", "entropy (nats/token)"),
    ("response_length/mean", "response length (tokens)"),
    ("timing/step", "step time (s)"),
)
TIMING_PREFIX = "timing/"


def plot_learning_curves(run_dir: str | Path, rows: Optional[Sequence[dict[str, Any]]] = None,
                         curves: Sequence[tuple[str, str]] = CURVES,
                         filename: str = "learning_curves.png") -> Optional[Path]:
    """Plot each metric in ``curves`` of ``rows`` (one dict per step, with ``step``; default: the run's
    ``metrics.jsonl``), one panel each, into ``run_dir``; returns the PNG path (None if nothing to plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir) if rows is None else rows
    present = [(key, title) for key, title in curves if any(row.get(key) is not None for row in rows)]
    if not present:
        return None
    columns = min(3, len(present))
    figure_rows = (len(present) + columns - 1) // columns
    figure, axes = plt.subplots(figure_rows, columns, figsize=(4.2 * columns, 3.0 * figure_rows), squeeze=False)
    for axis, (key, title) in zip(axes.flat, present):
        points = [(row["step"], row[key]) for row in rows if row.get(key) is not None]
        axis.plot([step for step, _ in points], [value for _, value in points], marker="o", markersize=2)
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(present):]:
        axis.axis("off")
    figure.tight_layout()
    path = Path(run_dir) / filename
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def step_time_breakdown(rows: Sequence[dict[str, Any]], skip_first: int = 1) -> dict[str, float]:
    """Mean seconds per phase over the logged steps (the first ``skip_first`` warm-up steps excluded)."""
    timed = [row for row in rows if row.get("timing/step") is not None][skip_first:]
    if not timed:
        return {}
    phases = sorted({key for row in timed for key in row if key.startswith(TIMING_PREFIX)})
    return {key[len(TIMING_PREFIX):]: sum(row.get(key) or 0.0 for row in timed) / len(timed) for key in phases}


def format_summary(title: str, figures: dict[str, Any], breakdown: dict[str, float]) -> str:
    """A plain-text summary block: the headline figures, then the step-time breakdown with shares."""
    lines = [f"== {title} ==", *(f"  {name:<34} {value}" for name, value in figures.items())]
    total = breakdown.get("step")
    if total:
        lines.append("  step time breakdown (mean s/step, share):")
        for phase, seconds in sorted(breakdown.items(), key=lambda item: -item[1]):
            if phase != "step":
                lines.append(f"    {phase:<30} {seconds:7.3f}  {100 * seconds / total:5.1f} %")
        lines.append(f"    {'total':<30} {total:7.3f}")
    return "\n".join(lines)
