"""``hybridrl export``: a checkpoint's policy as a Hugging Face directory (safetensors + config + tokenizer).

The actor's shards (``checkpoints/global_step_<k>/actor/dcp``, written by the FSDP2 workers at any DP size) are loaded
into the unsharded model built from the run's ``model.path`` in one process (no Ray, no process group), then written
by the same ``export_hf`` the workers use, so the files equal those of ``trainer.export_at_end``. The result loads with
plain ``transformers`` (``AutoModelForCausalLM.from_pretrained``) and with vLLM.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from hybridrl.trainers.checkpoints import (TRAINER_STATE, CheckpointManager, DamagedCheckpointError,
                                          load_trainer_state, verify_checkpoint)


class ExportError(ValueError):
    """The export source is not a complete hybridrl checkpoint (or run directory), or the output is not writable."""


def resolve_checkpoint(source: str | Path) -> Path:
    """The checkpoint directory that ``source`` names: itself if it is one (``…/global_step_<k>``), else the
    ``latest`` checkpoint of a run directory (or of its ``checkpoints`` directory)."""
    source = Path(source)
    if not source.exists():
        raise ExportError(f"{source} does not exist")
    if (source / TRAINER_STATE).is_file():
        return source
    if source.name.endswith(".partial"):
        raise ExportError(f"{source} is a half-written checkpoint (a crash interrupted its write); export a complete "
                          "one, e.g. the run directory (its latest checkpoint)")
    run_dir = source.parent if source.name == "checkpoints" else source
    if (run_dir / "checkpoints").is_dir():
        latest = CheckpointManager(run_dir).latest()
        if latest is None:
            raise ExportError(f"{run_dir} has no complete checkpoint under checkpoints/ (set trainer.save_freq or "
                              "trainer.save_at_end=true)")
        return latest
    raise ExportError(f"{source} is neither a hybridrl run directory (with checkpoints/) nor a checkpoint "
                      f"(a checkpoints/global_step_<k> directory holding {TRAINER_STATE})")


def export_checkpoint(source: str | Path, output_dir: str | Path) -> Path:
    """Write the policy of checkpoint/run ``source`` to ``output_dir`` as a Hugging Face directory; returns it."""
    from hybridrl.config.schema import ModelConfig
    from torch.distributed.checkpoint.api import CheckpointException

    from hybridrl.engines.checkpoint import export_hf, load_sharded
    from hybridrl.modeling.model_builder import build_model, load_tokenizer

    checkpoint = resolve_checkpoint(source)
    output_dir = Path(output_dir)
    if output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())):
        raise ExportError(f"output directory {output_dir} already exists and is not empty; choose a new one")
    _check_writable(output_dir)
    try:
        verify_checkpoint(checkpoint)
        model_path = load_trainer_state(checkpoint).get("model_path")
    except DamagedCheckpointError as damage:
        raise ExportError(f"{damage}; export another checkpoint (hybridrl export <run dir>/checkpoints/"
                          "global_step_<k> OUT_DIR)") from None
    if not model_path or not Path(model_path).is_dir():
        raise ExportError(f"checkpoint {checkpoint} was trained from model.path={model_path!r}, which is not a "
                          "directory here; the export needs that model's config and tokenizer")
    model_config = ModelConfig(path=str(model_path), **_run_model_settings(checkpoint.parent.parent))
    model = build_model(model_config, "actor")
    try:
        load_sharded(checkpoint / "actor", model, restore_rng=False)  # one process: DCP reads every shard
    except (ValueError, RuntimeError, CheckpointException) as error:
        cause = error.failures[min(error.failures)][0] if isinstance(error, CheckpointException) else error
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise ExportError(f"cannot load the actor shards of {checkpoint} into the model at {model_path} (a "
                          f"checkpoint of a different model?): {type(cause).__name__}: {reason}") from None
    return export_hf(model, load_tokenizer(model_config), output_dir)


def _check_writable(output_dir: Path) -> None:
    """The output's nearest existing ancestor must be a directory we can write into."""
    ancestor = output_dir.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ExportError(f"output directory {output_dir}: {ancestor} is a regular file, not a directory")
    if not os.access(ancestor, os.W_OK):
        raise ExportError(f"output directory {output_dir}: {ancestor} is not writable")


def _run_model_settings(run_dir: Path) -> dict[str, Any]:
    """``model.tokenizer_path`` / ``trust_remote_code`` from the run's dumped ``config.yaml`` (if it has one)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return {}
    model = (yaml.safe_load(path.read_text()) or {}).get("model") or {}
    return {key: model[key] for key in ("tokenizer_path", "trust_remote_code") if key in model}
