"""Soak: 200 steps of the tiny GRPO run (HF rollout, FSDP2 actor on 2 CPU ranks, reward worker processes).

After a warm-up, resident memory of the controller and of every worker must not keep growing (least-squares slope of
RSS against step, bounded), file descriptors and the driver's live Ray object references must stay flat, and when
the run ends no process it started may be left. Samples are taken after every step by a trainer subclass that only
observes (``train_step`` is the real one).

Measured on the shared 2-core box (load average 10–17): 200 steps in 126–159 s; RSS slope over steps 50–200
controller ≈ +0.005 MiB/step, each actor rank ≈ +0.017–0.024 MiB/step falling to ≤ +0.005 over the last 75 steps
(allocator warm-up, not a leak), reward workers 0; fds and live object references unchanged.
"""

from __future__ import annotations

import gc
import time

import psutil
import pytest
import ray
from bad_input_cases import run_overrides

from hybridrl.config import load_config
from hybridrl.controller.trainer import RLTrainer
from hybridrl.utils.tiny_model import save_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.distributed]

STEPS, WARMUP = 200, 50
MAX_SLOPE_MB_PER_STEP = 0.05  # 50 KB/step: 10k steps would add 0.5 GB; a leak of one batch per step is far above
MAX_LATE_SLOPE_MB_PER_STEP = 0.02  # the last 75 steps: allocator warm-up is over (measured ≈ 0.001–0.005)
MAX_FD_GROWTH, MAX_REF_GROWTH = 4, 8


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def slope(values: list[float]) -> float:
    """Least-squares slope of ``values`` against their index (units per step)."""
    count = len(values)
    mean_x, mean_y = (count - 1) / 2, sum(values) / count
    covariance = sum((index - mean_x) * (value - mean_y) for index, value in enumerate(values))
    return covariance / sum((index - mean_x) ** 2 for index in range(count))


class SoakTrainer(RLTrainer):
    """Records, after each step: RSS (MiB) and open fds of the controller and each worker, and live object refs."""

    samples: list[dict[str, float]] = []

    def train_step(self, prompts):
        metrics = super().train_step(prompts)
        gc.collect()
        pids = {"controller": psutil.Process().pid}
        pids.update({f"actor{rank}": location.pid for rank, location in enumerate(self._actor().locations)})
        pids.update({f"reward{index}": pid for index, pid in enumerate(sorted(self.scoring.scorer.worker_pids))})
        sample = {f"rss/{name}": rss_mb(pid) for name, pid in pids.items()}
        sample.update({f"fds/{name}": float(psutil.Process(pid).num_fds()) for name, pid in pids.items()})
        sample["refs"] = float(len(ray._private.worker.global_worker.core_worker.get_all_reference_counts()))
        sample["pids"] = pids  # type: ignore[assignment]
        SoakTrainer.samples.append(sample)
        return metrics


@pytest.mark.timeout(1800)
def test_200_steps_memory_fds_objects_and_processes_stay_flat(tmp_path):
    config = load_config(run_overrides(save_tiny_model(tmp_path / "model"), tmp_path / "run",
                                       f"trainer.total_training_steps={STEPS}", "trainer.save_freq=100"))
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    started = time.monotonic()
    SoakTrainer.samples = []
    result = SoakTrainer(config).fit()
    seconds = time.monotonic() - started
    assert result.global_step == STEPS and len(SoakTrainer.samples) == STEPS

    steady = SoakTrainer.samples[WARMUP:]
    half = len(steady) // 2
    rss_keys = [key for key in steady[0] if key.startswith("rss/")]
    report = {key: slope([sample[key] for sample in steady]) for key in rss_keys}
    halves = {key: (slope([sample[key] for sample in steady[:half]]), slope([sample[key] for sample in steady[half:]]))
              for key in rss_keys}
    print(f"\nsoak: {STEPS} steps in {seconds:.0f} s; RSS slope after step {WARMUP} (MiB/step; first half, second "
          "half): " + ", ".join(f"{key[4:]} {value:+.4f} ({halves[key][0]:+.4f}, {halves[key][1]:+.4f})"
                                for key, value in report.items())
          + "; RSS at the end (MiB): " + ", ".join(f"{key[4:]} {steady[-1][key]:.0f}" for key in rss_keys)
          + f"; fds {[int(steady[0][k]) for k in steady[0] if k.startswith('fds/')]} -> "
          + f"{[int(steady[-1][k]) for k in steady[-1] if k.startswith('fds/')]}; live object refs "
          + f"{steady[0]['refs']:.0f} -> {steady[-1]['refs']:.0f}")
    for key, value in report.items():
        assert value < MAX_SLOPE_MB_PER_STEP and halves[key][1] < MAX_LATE_SLOPE_MB_PER_STEP, (key, value, halves[key])
    for key in [key for key in steady[0] if key.startswith("fds/")]:
        assert max(sample[key] for sample in steady) <= steady[0][key] + MAX_FD_GROWTH, key
    assert max(sample["refs"] for sample in steady[-20:]) <= steady[0]["refs"] + MAX_REF_GROWTH

    started_pids = {pid for sample in SoakTrainer.samples for pid in sample["pids"].values()} - {psutil.Process().pid}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        leftovers = [pid for pid in started_pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        # multiprocessing's resource tracker is one per process for its lifetime (started by the first spawn), not
        # per run: it is not a leak.
        new_children = {child.pid for child in psutil.Process().children(recursive=True)
                        if "multiprocessing.resource_tracker" not in " ".join(child.cmdline())} - before
        if not leftovers and not new_children:
            break
        time.sleep(0.5)
    assert leftovers == [] and new_children == set()
