"""Experiment tracking: one ``Tracker`` fans each step's metrics out to the configured backends.

Backends (``trainer.logger``): ``console`` (a live progress bar with ETA and the key figures, via rich), ``jsonl``
(``metrics.jsonl`` in the run directory — the file tests and plots read), ``tensorboard``, ``wandb``, ``mlflow``,
``prometheus`` (an HTTP endpoint, :mod:`hybridrl.utils.prometheus`) — imported only when configured; a missing
package is a clear error naming the backend.

Every step's metrics gain ``time/*`` (ETA from the measured step time) and, with
``trainer.monitoring.price_per_gpu_hour``, ``cost/*`` figures (:class:`~hybridrl.utils.timing.RunClock`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional, Protocol, Sequence

from hybridrl.utils.timing import RunClock, format_duration

# The figures the console shows after the progress bar, in order, when present.
CONSOLE_KEYS = (
    ("critic/score/mean", "score"), ("val/accuracy", "val acc"), ("actor/pg_loss", "pg loss"),
    ("actor/kl_loss", "kl"), ("actor/entropy", "entropy"), ("actor/grad_norm", "|g|"),
    ("response_length/mean", "len"), ("timing/step", "s/step"), ("sft/sft_loss", "sft loss"), ("rm/loss", "rm loss"),
    ("cost/projected", "cost"),
)


class Backend(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class JsonlBackend:
    """Appends ``{"step": s, **metrics}`` lines to ``<run_dir>/metrics.jsonl`` (flushed every step)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: dict[str, float], step: int) -> None:
        clean = {key: (value if math.isfinite(value) else None) for key, value in metrics.items()}
        self._file.write(json.dumps({"step": step, **clean}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorboardBackend:
    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class ConsoleBackend:
    """A rich progress bar over the run's steps; each step updates the bar's description with the key figures."""

    def __init__(self, total_steps: int, description: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        # The ETA comes from RunClock (the measured step time without the first step's start-up), not from rich.
        self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("eta {task.fields[eta]}"),
                                  TextColumn("{task.fields[figures]}"), transient=False)
        self._task = self._progress.add_task(description, total=total_steps, figures="", eta="-")
        self._progress.start()

    def log(self, metrics: dict[str, float], step: int) -> None:
        figures = "  ".join(f"{label} {metrics[key]:.3g}" for key, label in CONSOLE_KEYS if key in metrics)
        eta = format_duration(metrics["time/eta_s"]) if "time/eta_s" in metrics else "-"
        self._progress.update(self._task, completed=step, figures=figures, eta=eta)

    def close(self) -> None:
        self._progress.stop()


class WandbBackend:
    def __init__(self, project: str, name: str, config: dict[str, Any]) -> None:
        import wandb

        self._run = wandb.init(project=project, name=name, config=config)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowBackend:
    def __init__(self, experiment: str, name: str) -> None:
        import mlflow

        mlflow.set_experiment(experiment)
        self._mlflow = mlflow
        self._run = mlflow.start_run(run_name=name)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._mlflow.log_metrics({key.replace("@", "_at_"): value for key, value in metrics.items()}, step=step)

    def close(self) -> None:
        self._mlflow.end_run()


class MonitoringSettings(Protocol):
    """What the tracker reads of ``trainer.monitoring`` (:class:`hybridrl.config.monitoring.MonitoringConfig`)."""

    prometheus_host: str
    prometheus_port: int
    price_per_gpu_hour: Optional[float]


class Tracker:
    """Sends every step's metrics to each backend named in ``loggers``. ``monitoring`` (``trainer.monitoring``)
    is needed by the ``prometheus`` backend and for cost figures; without it there are neither."""

    def __init__(self, loggers: Sequence[str], run_dir: str | Path, *, total_steps: int, project: str = "hybridrl",
                 experiment: str = "default", config: Optional[dict[str, Any]] = None,
                 monitoring: Optional[MonitoringSettings] = None, num_devices: int = 1, start_step: int = 0) -> None:
        run_dir = Path(run_dir)
        self.backends: list[Backend] = []
        for name in loggers:
            self.backends.append(_build(name, run_dir, total_steps, project, experiment, config or {}, monitoring))
        self.clock = RunClock(total_steps, start_step=start_step, num_devices=num_devices,
                              price_per_gpu_hour=monitoring.price_per_gpu_hour if monitoring else None)

    def log(self, metrics: dict[str, float], step: int) -> None:
        metrics = {**metrics, **self.clock.mark(step)}
        for backend in self.backends:
            backend.log(metrics, step)

    def close(self) -> None:
        for backend in self.backends:
            backend.close()


def _build(name: str, run_dir: Path, total_steps: int, project: str, experiment: str, config: dict,
           monitoring: Optional[MonitoringSettings]) -> Backend:
    try:
        if name == "console":
            return ConsoleBackend(total_steps, f"{project}/{experiment}")
        if name == "jsonl":
            return JsonlBackend(run_dir)
        if name == "tensorboard":
            return TensorboardBackend(run_dir)
        if name == "wandb":
            return WandbBackend(project, experiment, config)
        if name == "mlflow":
            return MlflowBackend(project, experiment)
        if name == "prometheus":
            from hybridrl.utils.prometheus import PrometheusBackend

            if monitoring is None:
                raise ValueError("trainer.logger includes 'prometheus' but this run has no trainer.monitoring settings")
            return PrometheusBackend(monitoring.prometheus_host, monitoring.prometheus_port, project, experiment)
    except ImportError as error:
        raise ValueError(f"trainer.logger includes {name!r} but its package is not installed "
                         f"(pip install 'hybridrl[tracking]'; prometheus-client for prometheus): {error}") from None
    raise ValueError(f"trainer.logger: unknown backend {name!r}")


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of ``<run_dir>/metrics.jsonl`` (one dict per logged step), for plots, summaries and tests."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def prepare_metrics_file(run_dir: str | Path, resumed_step: int) -> None:
    """Keep ``metrics.jsonl`` consistent with the run: on a resume drop rows logged after the checkpoint's step
    (they will be logged again); on a fresh start move an old file aside to ``metrics.jsonl.<n>``."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return
    if resumed_step > 0:
        kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= resumed_step]
        path.write_text("".join(line + "\n" for line in kept))
        return
    index = 1
    while path.with_name(f"metrics.jsonl.{index}").exists():
        index += 1
    path.rename(path.with_name(f"metrics.jsonl.{index}"))
