"""What ``hybridrl eval`` evaluates, and with which settings: the model behind a source path, the config that says how
it generates and is scored, and the test set.

A source is one of
- a **run directory** (it holds ``config.yaml``): its ``hf/`` export when there is one (the run's final weights), else
  its latest checkpoint;
- a **checkpoint** (``…/checkpoints/global_step_<k>``), exported once into the output directory's ``model/``;
- a **Hugging Face model directory** (``config.json``), e.g. ``hybridrl export``'s output or a run's ``hf/``.

When the model belongs to an RL run, the run's own ``config.yaml`` is the base config — the same data, reward
functions, engine, precision and validation sampling as the run's validation, so ``hybridrl eval`` reproduces it —
unless ``--config-name`` names another. Overrides apply on top either way.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from hybridrl.config.schema import TrainConfig
from hybridrl.data.images import image_reader
from hybridrl.data.dataset import PromptDataset, PromptOptions
from hybridrl.data.synthetic import build_synthetic_task
from hybridrl.trainers.checkpoints import TRAINER_STATE, CheckpointManager

logger = logging.getLogger(__name__)

RUN_CONFIG = "config.yaml"


@dataclass(frozen=True)
class EvalSource:
    """A resolved source: the HF directory to load (``model_dir``), or the ``checkpoint`` to export first; the
    ``run_dir`` whose ``config.yaml`` describes the run (``None`` for a bare model directory)."""

    given: str
    model_dir: Optional[Path]
    checkpoint: Optional[Path]
    run_dir: Optional[Path]

    def describe(self) -> str:
        what = f"checkpoint {self.checkpoint}" if self.checkpoint is not None else f"model {self.model_dir}"
        return what + (f" (run {self.run_dir})" if self.run_dir is not None else "")

    def _run_tree(self) -> Optional[dict]:
        """The run's ``config.yaml`` as a tree (``None`` without one)."""
        if self.run_dir is None or not (self.run_dir / RUN_CONFIG).is_file():
            return None
        return yaml.safe_load((self.run_dir / RUN_CONFIG).read_text()) or {}

    def task_overrides(self) -> list[str]:
        """An SFT run on a synthetic task: its task and lengths as overrides (``hybridrl eval`` of the run then scores
        that task's held-out set, not the default task's); empty otherwise."""
        tree = self._run_tree()
        if tree is None or _is_rl_config(tree):
            return []
        data = tree.get("data") or {}
        if not isinstance(data, dict) or not data.get("synthetic_task"):
            return []
        carried = {key: data[key] for key in ("synthetic_task", "synthetic_task_kwargs", "max_prompt_length",
                                              "max_response_length", "seed") if key in data}
        logger.info("%s: evaluating on the run's task %s", self.run_dir / RUN_CONFIG, data["synthetic_task"])
        return [f"data.{key}={_override_value(value)}" for key, value in carried.items()]

    @property
    def run_config(self) -> Optional[Path]:
        """The run's ``config.yaml`` when it is an RL trainer's config (an SFT or RM run's is not a base for eval)."""
        tree = self._run_tree()
        if tree is None:
            return None
        if not _is_rl_config(tree):
            logger.info("%s is not an RL trainer's config: evaluating with --config-name ppo_trainer (name another "
                        "with --config-name)", self.run_dir / RUN_CONFIG)
            return None
        return self.run_dir / RUN_CONFIG


def _is_rl_config(tree: dict) -> bool:
    return {"actor", "rollout", "data"} <= set(tree)


def _override_value(value: Any) -> str:
    """``value`` (a YAML scalar, list or mapping with identifier keys) in Hydra's override grammar."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_override_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_override_value(item) for item in value) + "]"
    return json.dumps(value)


def resolve_eval_source(source: str | Path) -> EvalSource:
    """The :class:`EvalSource` a command-line path names; ``ValueError`` naming the path when it is none of them."""
    path = Path(source)
    if not path.exists():
        raise ValueError(f"{source}: no such checkpoint, run directory or model directory")
    if (path / TRAINER_STATE).is_file():
        return EvalSource(str(source), None, path, _run_of_checkpoint(path))
    if (path / "config.json").is_file():
        run = path.parent if (path.parent / RUN_CONFIG).is_file() else None
        return EvalSource(str(source), path, None, run)
    if (path / RUN_CONFIG).is_file():
        if (path / "hf" / "config.json").is_file():
            return EvalSource(str(source), path / "hf", None, path)
        latest = CheckpointManager(path).latest() if (path / "checkpoints").is_dir() else None
        if latest is None:
            raise ValueError(f"{source}: the run directory has neither an hf/ export nor a complete checkpoint "
                             "(trainer.export_at_end, trainer.save_freq) to evaluate")
        return EvalSource(str(source), None, latest, path)
    raise ValueError(f"{source}: not a checkpoint (checkpoints/global_step_<k> with {TRAINER_STATE}), a run "
                     f"directory (with {RUN_CONFIG}) or a Hugging Face model directory (with config.json)")


def _run_of_checkpoint(checkpoint: Path) -> Optional[Path]:
    run = checkpoint.parent.parent  # <run>/checkpoints/global_step_<k>
    return run if (run / RUN_CONFIG).is_file() else None


def model_directory(source: EvalSource, output_dir: Path) -> Path:
    """The HF directory to load: the source's own, or its checkpoint exported into ``<output_dir>/model`` (once: a
    resumed evaluation reuses the export)."""
    if source.model_dir is not None:
        return source.model_dir
    from hybridrl.trainers.export import export_checkpoint

    target = output_dir / "model"
    if not (target / "config.json").is_file():
        logger.info("exporting %s to %s", source.checkpoint, target)
        export_checkpoint(source.checkpoint, target)
    return target


def eval_config(source: EvalSource, model_dir: Path, overrides: Sequence[str], config_name: Optional[str], *,
                config_path: Optional[Path] = None, config_dirs: Sequence[Path] = (),
                check_paths: bool = True) -> TrainConfig:
    """The run's config (or ``config_name``'s) with ``model.path`` set to ``model_dir`` and ``overrides`` applied."""
    from hybridrl.config import load_config

    task = source.task_overrides() if config_name is None else []
    overrides = [f"model.path={model_dir}", *task, *overrides]
    run_config = source.run_config if config_name is None else None
    if run_config is not None:
        logger.info("settings of the run: %s", run_config)
        config = load_config(overrides, run_config.stem, conf_dir=run_config.parent, check_paths=check_paths)
    else:
        config = load_config(overrides, config_name or "ppo_trainer", conf_dir=config_path, extra_dirs=config_dirs,
                             check_paths=check_paths)
    if not isinstance(config, TrainConfig):
        raise ValueError(f"--config-name={config_name}: `hybridrl eval` needs an RL trainer's config (it says how to "
                         f"generate and score), not a {type(config).__name__}")
    return config


def eval_dataset(config: TrainConfig, tokenizer, files: Sequence[str] = (), limit: Optional[int] = None) -> PromptDataset:
    """The test set: ``files`` (verl's row layout, with ``reward_model.ground_truth``) when given, else the config's
    synthetic task's held-out set, else ``data.val_files``; the first ``limit`` prompts when set."""
    data, options = config.data, PromptOptions.from_data_config(config.data, image_reader(config.model.path))
    if files:
        dataset = PromptDataset.from_files(files, tokenizer, options, name="eval")
    elif data.synthetic_task is not None:
        task = build_synthetic_task(data.synthetic_task, seed=data.seed, **dict(data.synthetic_task_kwargs or {}))
        dataset = PromptDataset.from_rows(task.validation_rows(), tokenizer, options, name="val",
                                          source=f"synthetic task {data.synthetic_task!r} (val)")
    elif data.val_files:
        dataset = PromptDataset.from_files(data.val_files, tokenizer, options, name="val")
    else:
        raise ValueError("no test set: give --data FILE [FILE ...] (parquet or JSONL rows with "
                         "reward_model.ground_truth) or data.val_files=[...]")
    if limit is not None:
        if limit < 1:
            raise ValueError(f"--limit={limit}: must be a positive number of prompts")
        dataset = PromptDataset(dataset.prompts[:limit], name=dataset.name, num_filtered=dataset.num_filtered,
                                images=dataset.images)
    return dataset


def default_output_dir(source: EvalSource, data_files: Sequence[str]) -> Path:
    """``<run>/eval/<data>`` for a run's model, else ``runs/eval/<model>/<data>``; ``<data>`` is the test set's
    file stem (``val`` for the config's own held-out set)."""
    data = "+".join(Path(file).stem for file in data_files) or "val"
    if source.run_dir is not None:
        return source.run_dir / "eval" / data
    return Path("runs") / "eval" / Path(source.given).resolve().name / data
