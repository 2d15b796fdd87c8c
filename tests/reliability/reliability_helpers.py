"""Helpers of the reliability tests: the overrides of one tiny GRPO run (2 CPU ranks) and bit-exact comparisons."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from hybridrl.utils.tracking import read_metrics

STEPS = 3
# Everything that fixes the numerics; the tests add only fault-injection, restart and resume settings.
RUN_OVERRIDES = [
    "model.dtype=float32", f"trainer.total_training_steps={STEPS}", "trainer.save_freq=1", "trainer.logger=[jsonl]",
    "trainer.val_before_train=false", "trainer.ray.num_cpus=4",
    "data.synthetic_task_kwargs={max_digits: 1, operators: '+', num_val: 8}", "data.train_batch_size=4", "rollout.n=2",
    "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size_per_gpu=2", "data.max_response_length=3",
    "actor.optim.lr=1e-3", "actor.use_kl_loss=true",
]
COMPARED = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", "response_length/mean")


def overrides(model_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    """The run's overrides; a key given in ``extra`` replaces the same key of ``RUN_OVERRIDES``."""
    replaced = {item.split("=", 1)[0] for item in extra}
    kept = [item for item in RUN_OVERRIDES if item.split("=", 1)[0] not in replaced]
    return [f"model.path={model_dir}", f"trainer.default_local_dir={run_dir}", *kept, *extra]


def checkpoint_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The actor's full weights in a checkpoint directory (its DCP shards converted to one state dict)."""
    target = checkpoint / "weights.pt"
    dcp_to_torch_save(str(checkpoint / "actor" / "dcp"), str(target))
    weights = torch.load(target, weights_only=True)["model"]
    target.unlink()
    return weights


def assert_same_run(expected: Path, actual: Path, steps: int = STEPS) -> None:
    """Same metrics at every step and the same final weights, bit for bit."""
    expected_rows, actual_rows = read_metrics(expected), read_metrics(actual)
    assert [row["step"] for row in actual_rows] == list(range(1, steps + 1))
    for want, got in zip(expected_rows, actual_rows):
        for key in COMPARED:
            assert want[key] == got[key], (want["step"], key, want[key], got[key])
    final = f"checkpoints/global_step_{steps}"
    want_weights, got_weights = checkpoint_weights(expected / final), checkpoint_weights(actual / final)
    assert want_weights.keys() == got_weights.keys()
    for name, tensor in want_weights.items():
        assert torch.equal(tensor, got_weights[name]), name


# Ray's per-node agents notice their raylet's death only after their own checks (publishing the raylet's error to the
# dead GCS times out after about a minute) and then exit by themselves; they hold no resources a new instance needs.
SLOW_TO_EXIT = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


@dataclass
class ChildRun:
    """A finished ``hybridrl train`` child: exit status, output, and what outlived it (pid → command line)."""

    returncode: int
    output: str
    leftovers: dict[int, str]
    seconds: float

    @property
    def leaked(self) -> dict[int, str]:
        """Leftovers other than Ray's slow-to-exit agents: the raylet, GCS, workers, … must all be gone."""
        return {pid: cmd for pid, cmd in self.leftovers.items() if not cmd.startswith(SLOW_TO_EXIT)}


def run_train_subprocess(args: list[str], log: Path, timeout_s: float = 300) -> ChildRun:
    """``hybridrl train ARGS`` in a child process in a session of its own, so the Ray processes it starts can be found
    by process group; output goes to ``log`` (a pipe would stay open while an orphan holds it). When this returns
    nothing of the child is left: what outlives it by 15 s is killed, and listed in ``leftovers``."""
    command = [sys.executable, "-m", "hybridrl.cli", "train", "--no-check-paths", *args]
    started = time.monotonic()
    with log.open("w") as output:
        child = subprocess.Popen(command, start_new_session=True, stdout=output, stderr=subprocess.STDOUT,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            child.wait(timeout=timeout_s)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            seconds = time.monotonic() - started
            leftovers = reap_process_group(child.pid, timeout_s=15)
    return ChildRun(child.returncode, log.read_text(), leftovers, seconds)


def process_group_members(pgid: int) -> dict[int, str]:
    """Live (not zombie) processes whose process group is ``pgid``: pid → command line."""
    members = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members[int(entry.name)] = (entry / "cmdline").read_text().replace("\0", " ").strip()
        except (OSError, IndexError, ValueError):
            continue
    return members


def reap_process_group(pgid: int, timeout_s: float) -> dict[int, str]:
    """Wait until only Ray's slow-to-exit agents (or nothing) are left of group ``pgid``, at most ``timeout_s``; kill
    whatever is left (so nothing leaks into later tests) and return it (the caller asserts on it)."""
    deadline = time.monotonic() + timeout_s
    members = process_group_members(pgid)
    while time.monotonic() < deadline and any(not cmd.startswith(SLOW_TO_EXIT) for cmd in members.values()):
        time.sleep(0.5)
        members = process_group_members(pgid)
    for pid in members:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return members
