"""Checkpoints of a sharded model: distributed (``torch.distributed.checkpoint``) for resume, and HF export.

- ``save_sharded`` / ``load_sharded``: model + optimizer + LR scheduler with DCP (each rank writes its shards; a load
  into a different DP size reshards), plus each rank's RNG states. Everything loads with ``weights_only=True``.
- ``export_hf``: the full fp32 weights gathered to rank 0 and written as safetensors with the config and tokenizer,
  loadable by plain ``transformers`` and by vLLM.
"""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from hybridrl.modeling.safe_load import SafeFileSystemReader, check_dcp_metadata, load_tensors


logger = logging.getLogger(__name__)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def rng_state() -> dict[str, Any]:
    """This process's RNG states (torch CPU, CUDA if present, numpy, python), as tensors and plain values."""
    _, numpy_keys, numpy_position, has_gauss, cached_gauss = np.random.get_state()
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": torch.from_numpy(numpy_keys.astype(np.int64)),
                             "numpy_pos": int(numpy_position), "numpy_gauss": [int(has_gauss), float(cached_gauss)],
                             "python": repr(random.getstate())}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the RNG states captured by :func:`rng_state`."""
    import ast

    torch.set_rng_state(state["torch"])
    numpy_state = np.random.get_state()
    has_gauss, cached_gauss = state.get("numpy_gauss", [0, 0.0])
    np.random.set_state((numpy_state[0], state["numpy"].numpy().astype(np.uint32), int(state["numpy_pos"]),
                         int(has_gauss), float(cached_gauss)))
    random.setstate(_tuple_tree(ast.literal_eval(state["python"])))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _tuple_tree(value: Any) -> Any:
    return tuple(_tuple_tree(item) for item in value) if isinstance(value, (list, tuple)) else value


def _state_options(trainable_only: bool) -> StateDictOptions:
    """``trainable_only`` (LoRA: adapters only) leaves frozen parameters out; they load from ``model.path`` instead,
    and loading is then not strict about them (DCP still refuses a checkpoint missing a requested key)."""
    return StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only)


def _sharded_state(model: nn.Module, optimizer: Optional[torch.optim.Optimizer],
                   options: StateDictOptions) -> dict[str, Any]:
    if optimizer is not None:
        model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
        return {"model": model_state, "optimizer": optimizer_state}
    return {"model": get_model_state_dict(model, options=options)}


def save_sharded(directory: str | Path, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                 scheduler: Any = None, *, trainable_only: bool = False) -> None:
    """Write ``model`` (+ optimizer, scheduler) shards and this rank's RNG state under ``directory`` (all ranks).

    ``trainable_only`` saves only parameters with ``requires_grad`` (LoRA adapters; the frozen base is ``model.path``).
    """
    directory = Path(directory)
    state = _sharded_state(model, optimizer, _state_options(trainable_only))
    dcp.save(state, checkpoint_id=str(directory / "dcp"))
    torch.save({"rng": rng_state()}, directory / f"rng_rank{_rank()}.pt")
    if scheduler is not None and _rank() == 0:  # identical on every rank: one copy, loadable at any DP size
        torch.save(scheduler.state_dict(), directory / "scheduler.pt")
    _barrier()


def load_sharded(directory: str | Path, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                 scheduler: Any = None, *, restore_rng: bool = True, trainable_only: bool = False) -> None:
    """Load what :func:`save_sharded` wrote, into an already sharded ``model`` (any DP size); ``trainable_only`` as
    it was saved."""
    directory = Path(directory)
    if not (directory / "dcp" / ".metadata").is_file():
        raise ValueError(f"{directory} is not a hybridrl checkpoint (no dcp/.metadata)")
    check_dcp_metadata(directory / "dcp" / ".metadata")  # a clear error here; the reader below re-checks what it reads
    options = _state_options(trainable_only)
    state = _sharded_state(model, optimizer, options)
    dcp.load(state, storage_reader=SafeFileSystemReader(str(directory / "dcp")))  # refuses pickle payloads
    set_state_dict(model, optimizer if optimizer is not None else (), model_state_dict=state["model"],
                   optim_state_dict=state.get("optimizer", {}), options=options)
    if scheduler is not None:
        scheduler_path = directory / "scheduler.pt"
        if not scheduler_path.is_file():
            raise ValueError(f"{directory} has no scheduler.pt: it was saved without an LR scheduler")
        scheduler.load_state_dict(load_tensors(scheduler_path))
    rng_path = directory / f"rng_rank{_rank()}.pt"
    if restore_rng and rng_path.is_file():
        set_rng_state(load_tensors(rng_path)["rng"])
    elif restore_rng:
        logger.warning("rank %d: %s was saved by fewer ranks; this rank keeps a fresh RNG state (sampling and "
                       "shuffling are re-seeded per step, so the run stays deterministic)", _rank(), directory)
    _barrier()


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded fp32 state dict on rank 0 (``{}`` on other ranks); every rank must call it."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def export_hf(model: nn.Module, tokenizer, directory: str | Path,
              merge: Optional[Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]] = None,
              writer: Optional[nn.Module] = None) -> Path:
    """Write a Hugging Face directory (config, safetensors, tokenizer) of ``model``'s current weights (all ranks call).

    ``merge`` turns the full state dict into the one to write and ``writer`` is the module whose ``save_pretrained``
    writes it (LoRA: adapters merged into the base weights, written by the PEFT model's base). Returns the directory. Only rank 0 writes; the others wait at a barrier.
    """
    directory = Path(directory)
    state = full_state_dict(model)
    if _rank() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        state = merge(state) if merge is not None else state
        writer = writer or model
        use_cache, writer.config.use_cache = writer.config.use_cache, True  # training turns the KV cache off
        try:
            writer.save_pretrained(directory, state_dict=state, safe_serialization=True)
        finally:
            writer.config.use_cache = use_cache
        if tokenizer is not None:
            tokenizer.save_pretrained(directory)
        copy_processor_files(getattr(writer, "name_or_path", ""), directory)
    _barrier()
    return directory


PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")
"""A vision-language model's image/video processor settings, which travel with its weights."""


def copy_processor_files(source: str | Path, directory: Path) -> None:
    """Copy the processor files a model directory ``source`` holds (a vision-language model's image processor) into
    an export ``directory``, so the export reads images as the model it came from."""
    if not source or not Path(source).is_dir() or Path(source).resolve() == Path(directory).resolve():
        return
    for name in PROCESSOR_FILES:
        if (Path(source) / name).is_file():
            shutil.copyfile(Path(source) / name, Path(directory) / name)
