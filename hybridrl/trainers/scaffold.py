"""What every trainer (RL, SFT, RM) does around its loop, written once: the run directory, Ray and the resource pools,
tracking, and finding the checkpoint to resume from.

    with cluster(config.trainer.ray, pool_specs, role_to_pool) as pools:   # Ray up, pools reserved; released after
        checkpoint, state = resume_point(checkpoints, resume_mode, model_path=config.model.path)
        tracker = open_tracker(config.trainer, run_dir, total_steps=..., start_step=state step)
        ... the trainer's own loop ...
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from hybridrl.runtime import PoolSpec, ResourcePoolManager, start_ray
from hybridrl.trainers.checkpoints import CheckpointManager, load_trainer_state, resume_checkpoint
from hybridrl.utils.tracking import MonitoringSettings, Tracker, prepare_metrics_file

logger = logging.getLogger(__name__)


@contextmanager
def cluster(ray_config, pools: Sequence[PoolSpec], role_to_pool: Mapping[str, str]) -> Iterator[ResourcePoolManager]:
    """Ray started (``trainer.ray``), ``pools`` reserved, ``role_to_pool`` naming each role's; on leaving, the pools
    are released and Ray stopped (also after an error)."""
    with start_ray(ray_config) as runtime:
        manager = ResourcePoolManager(pools, role_to_pool)
        manager.create(runtime)
        try:
            yield manager
        finally:
            manager.release()


def resume_point(checkpoints: CheckpointManager, resume_mode: str, *, model_path: str,
                 resume_from_path: Optional[str] = None) -> tuple[Optional[Path], dict[str, Any]]:
    """The checkpoint a run continues from and its trainer state, or ``(None, {})`` for a fresh start.

    Half-written checkpoints a crash left behind are removed first (and said so). A checkpoint trained from another
    ``model.path`` is refused (``ValueError``): resuming it would silently train a different model.
    """
    for stale in checkpoints.sweep_partials():
        logger.warning("removed a half-written checkpoint left by a crash: %s", stale)
    checkpoint = resume_checkpoint(resume_mode, checkpoints.root.parent, resume_from_path)
    if checkpoint is None:
        return None, {}
    state = load_trainer_state(checkpoint)
    if state.get("model_path") != model_path:
        raise ValueError(f"checkpoint {checkpoint} was trained from model.path={state.get('model_path')!r}, "
                         f"not {model_path!r}; use trainer.resume_mode=disable to start afresh")
    return checkpoint, state


def open_tracker(trainer, run_dir: Path, *, total_steps: int, start_step: int = 0,
                 monitoring: Optional[MonitoringSettings] = None, num_devices: int = 1) -> Tracker:
    """The run's tracker (``trainer.logger``, project and experiment names), with ``metrics.jsonl`` made consistent
    with a run that starts at ``start_step`` (rows past a resumed checkpoint dropped; an old run's file moved aside)."""
    prepare_metrics_file(run_dir, start_step)
    return Tracker(trainer.logger, run_dir, total_steps=total_steps, project=trainer.project_name,
                   experiment=trainer.experiment_name, monitoring=monitoring, num_devices=num_devices,
                   start_step=start_step)
