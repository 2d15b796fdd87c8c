"""The soak run itself, in a fresh process: ``python soak_run.py WORK_DIR STEPS`` writes ``WORK_DIR/soak.json``.

A fresh interpreter keeps the measurement about the run: inside a pytest process that has run a thousand tests, the
per-step ``gc.collect()`` walks that whole heap (steps went from 0.2 s to 4 s) and the controller's RSS carries
the other tests' garbage. Samples are taken after every step by a trainer subclass that only observes
(``train_step`` is the real one); after ``fit()`` returns, the processes the run started are looked for for 30 s.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

import psutil
import ray
import torch

from bad_input_cases import run_overrides
from hybridrl.config import load_config
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tiny_model import save_tiny_model

LEFTOVER_WAIT_S = 30


class SoakTrainer(RLTrainer):
    """Records, after each step: RSS (MiB) and open fds of the controller and each worker, and live object refs."""

    samples: list[dict] = []

    def train_step(self):
        metrics = super().train_step()
        gc.collect()
        pids = {"controller": psutil.Process().pid}
        pids.update({f"actor{rank}": location.pid for rank, location in enumerate(self._actor().locations)})
        pids.update({f"reward{index}": pid for index, pid in enumerate(sorted(self.scoring.scorer.worker_pids))})
        sample: dict = {f"rss/{name}": psutil.Process(pid).memory_info().rss / 2**20 for name, pid in pids.items()}
        sample.update({f"fds/{name}": float(psutil.Process(pid).num_fds()) for name, pid in pids.items()})
        sample["refs"] = float(len(ray._private.worker.global_worker.core_worker.get_all_reference_counts()))
        sample["pids"] = pids
        SoakTrainer.samples.append(sample)
        return metrics


def leftover_processes(started_pids: set[int], children_before: set[int]) -> tuple[list[int], list[str]]:
    """Processes of the run still alive after ``LEFTOVER_WAIT_S``: its workers, and new children of this process
    (Ray's own included). multiprocessing's resource tracker lives as long as this process (started by the first
    spawn): not a leak."""
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    while True:
        workers = [pid for pid in started_pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        children = [" ".join(child.cmdline())[:120] for child in psutil.Process().children(recursive=True)
                    if child.pid not in children_before
                    and "multiprocessing.resource_tracker" not in " ".join(child.cmdline())]
        if (not workers and not children) or time.monotonic() > deadline:
            return workers, children
        time.sleep(0.5)


def main(work_dir: Path, steps: int) -> None:
    torch.set_num_threads(1)  # as the suite's conftest does
    config = load_config(run_overrides(save_tiny_model(work_dir / "model"), work_dir / "run",
                                       f"trainer.total_training_steps={steps}", f"trainer.save_freq={steps // 2}"))
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    started = time.monotonic()
    result = SoakTrainer(config).fit()
    seconds = time.monotonic() - started
    started_pids = {pid for sample in SoakTrainer.samples for pid in sample["pids"].values()} - {psutil.Process().pid}
    workers, children = leftover_processes(started_pids, before)
    report = {"global_step": result.global_step, "seconds": seconds, "samples": SoakTrainer.samples,
              "leftover_workers": workers, "leftover_children": children}
    (work_dir / "soak.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
