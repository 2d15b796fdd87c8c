"""Settings every stand-alone trainer (``hybridrl sft``, ``hybridrl rm``) shares under ``trainer.``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hybridrl.config.frozen import FreezableConfig
from hybridrl.config.ray import RayConfig


@dataclass
class JobTrainerConfig(FreezableConfig):
    project_name: str = "hybridrl"
    """Project name (tracking, run directory)."""
    experiment_name: str = "run"
    """Experiment name (tracking, run directory)."""
    default_local_dir: str = "runs/${trainer.project_name}/${trainer.experiment_name}"
    """Run directory: resolved config, metrics, checkpoints (where the trainer keeps them), the exported model."""
    export_dir: Optional[str] = None
    """Where the trained model is written as a Hugging Face directory; ``null`` = ``<run dir>/hf``."""
    device: str = "auto"
    """``auto`` | ``cuda`` | ``cpu``."""
    nnodes: int = 1
    """Nodes in the job."""
    n_gpus_per_node: int = 1
    """Devices per node (CPU slots when ``device=cpu``)."""
    total_training_steps: int = 100
    """Optimizer steps."""
    seed: int = 1
    """Model-side seed (the initialisation of anything new, e.g. a reward model's score head)."""
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Trackers: ``console``, ``jsonl``, ``tensorboard``, ``wandb``, ``mlflow``."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Ray start-up settings."""
