"""Checkpoints never run code: a pickle payload in any checkpoint file is refused, naming the file, before it runs.

Real files: a checkpoint written by ``save_sharded`` (torch.distributed.checkpoint + .pt files) and by the trainer's
``CheckpointManager``, then one file replaced by a pickle whose loading would create a marker file.
"""

from __future__ import annotations

import ast
import os
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

import hybridrl
from hybridrl.trainers.checkpoints import CheckpointManager, load_trainer_state, resume_checkpoint, write_manifest
from hybridrl.engines.checkpoint import load_sharded, save_sharded
from hybridrl.modeling.safe_load import UnsafeCheckpointError


class Payload:
    """Unpickling this runs ``os.system("touch <marker>")``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def small_checkpoint(directory: Path) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    save_sharded(directory, model, optimizer, scheduler)
    return model, optimizer, scheduler


def fresh_copy(model: nn.Module) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(1)
    other = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(other.parameters(), lr=0.1)
    return other, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


@pytest.mark.filterwarnings("ignore::UserWarning")  # dcp: "assuming the intent is to save in a single process"
def test_a_real_checkpoint_still_loads(tmp_path):
    model, _, _ = small_checkpoint(tmp_path / "ckpt")
    other, optimizer, scheduler = fresh_copy(model)
    load_sharded(tmp_path / "ckpt", other, optimizer, scheduler)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, other.state_dict()[name]), name


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("poisoned", ["dcp/.metadata", "scheduler.pt", "rng_rank0.pt"])
def test_pickle_payload_in_a_worker_checkpoint_file_is_refused(tmp_path, poisoned):
    model, _, _ = small_checkpoint(tmp_path / "ckpt")
    marker = tmp_path / "pwned"
    target = tmp_path / "ckpt" / poisoned
    if poisoned.endswith(".pt"):
        torch.save({"rng": Payload(marker)}, target)
    else:
        target.write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(UnsafeCheckpointError) as caught:
        load_sharded(tmp_path / "ckpt", *fresh_copy(model))
    assert str(target) in str(caught.value) and "refused to load" in str(caught.value)
    assert not marker.exists()


def test_pickle_payload_in_the_trainer_state_is_refused(tmp_path):
    manager = CheckpointManager(tmp_path / "run")
    manager.partial_dir(1)
    checkpoint = manager.commit(1, {"global_step": 1, "model_path": "/m"})
    marker = tmp_path / "pwned"
    torch.save({"global_step": 1, "model_path": Payload(marker)}, checkpoint / "trainer_state.pt")
    write_manifest(checkpoint)  # whoever can plant the payload can rewrite the manifest: the loader must refuse it
    with pytest.raises(UnsafeCheckpointError, match="trainer_state.pt: refused to load"):
        load_trainer_state(resume_checkpoint("auto", tmp_path / "run", None))  # what the trainer does on resume
    with pytest.raises(UnsafeCheckpointError, match="trainer_state.pt: refused to load"):
        resume_checkpoint("resume_path", tmp_path / "run", str(checkpoint))
    assert not marker.exists()


def test_every_torch_load_in_the_package_is_weights_only_and_pickle_loads_are_known():
    """The audit, as a test: a new ``torch.load`` without ``weights_only=True`` or a new ``pickle.load`` fails here."""
    allowed_pickle = {"rewards/worker_pool.py",  # the parent's own bytes, sent to its reward worker over a pipe
                      "runtime/executors.py",  # an in-process deep copy of call arguments (local mode)
                      "modeling/safe_load.py"}  # the allow-listed unpickler itself
    root = Path(hybridrl.__file__).parent
    torch_loads, pickle_loads = [], []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
            where = f"{path.relative_to(root)}:{node.lineno}"
            if owner == "torch" and node.func.attr == "load":
                weights_only = [kw for kw in node.keywords if kw.arg == "weights_only"]
                if not (weights_only and isinstance(weights_only[0].value, ast.Constant) and weights_only[0].value.value):
                    torch_loads.append(where)
            if owner == "pickle" and node.func.attr in ("load", "loads", "Unpickler"):
                if str(path.relative_to(root)) not in allowed_pickle:
                    pickle_loads.append(where)
    assert torch_loads == [] and pickle_loads == []
