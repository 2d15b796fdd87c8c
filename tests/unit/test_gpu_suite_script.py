"""``benchmarks/gpu_suite.py`` without a GPU: a clear refusal, and (slow) every section's code path on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_suite.py"


def run_suite(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}  # hide any GPU: the CPU behaviour
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def test_without_a_gpu_it_says_so_and_measures_nothing(tmp_path):
    done = run_suite("--out", str(tmp_path / "report.json"), timeout=60)
    assert done.returncode == 2
    assert "gpu_suite: no GPU" in done.stderr and "torch.cuda.is_available() is False" in done.stderr
    assert not (tmp_path / "report.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke run is for machines without a GPU")
def test_cpu_smoke_runs_every_section(tmp_path):
    done = run_suite("--cpu-smoke", "--out", str(tmp_path / "report.json"), timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["attn_implementation"] == "sdpa"
    assert report["train"]["step_s"] > 0 and report["train"]["matmul_parameters"] > 0
    actor = {name: row for name, row in report["actor_steps"].items() if name != "section_s"}
    assert set(actor) == {"2x16_plain", "2x16_fused"} and all(row["step_s"] > 0 for row in actor.values())
    prompts, n, new_tokens = 2, 4, 4  # the smoke sizes
    assert 0 < report["generate"]["generated_tokens"] <= prompts * n * new_tokens
    parameters = report["build"]["parameters"]
    assert report["weight_sync"]["bytes"] == 2 * parameters  # every parameter once, in bf16 (tied head counted once)
