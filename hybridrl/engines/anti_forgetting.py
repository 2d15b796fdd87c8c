"""Keeping what the policy knew while RL moves it: PPO-ptx (an SFT loss term) and EWC (a pull to the start weights).

**PPO-ptx** (InstructGPT's "pretraining mix"): each optimizer step's loss becomes

    L = L_RL(mini-batch) + ptx_coef · NLL(SFT chunk) / (valid SFT tokens of the chunk over all ranks)

The SFT chunk is this rank's SFT rows for that mini-batch (the step's SFT rows cut into one chunk per mini-batch).
It runs as a second accumulation pass after the RL micro-batches, with its own **global** token normaliser, so
micro-batching and DP splits give the same gradient as one big batch (one extra gradient reduce-scatter per step).

**EWC** (Kirkpatrick et al. 2017): ``L += λ/2 · Σ_i F_i (θ_i − θ*_i)²`` with ``θ*`` the weights at the start and
``F`` a diagonal Fisher estimate: the mean over ``K`` batches of the squared gradient of the batch's token-mean
negative log-likelihood (responses sampled from the policy itself, so this is the model's Fisher, batch-averaged).
Its gradient ``λ F (θ − θ*)`` is added to each rank's gradient shard (elementwise, so no communication) before
clipping. ``F`` and ``θ*`` are kept as local FSDP shards (two extra copies of the trainable parameters) and saved
with the actor checkpoint as DCP (``ewc/``, loadable at another DP size), so a resumed run keeps its anchor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.tensor import DTensor

from hybridrl.engines.hooks import EngineView, StepHook
from hybridrl.engines.losses import Loss, Scaled
from hybridrl.engines.micro_batches import DataParallelGroup
from hybridrl.protocol import Batch

EWC_DIR = "ewc"
"""Where an actor checkpoint keeps EWC's anchor and Fisher (a DCP directory)."""


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a (possibly DTensor) parameter or gradient, as a plain tensor sharing its storage."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class PtxHook(StepHook):
    """The SFT term of every optimizer step of one update (``actor.ptx``): before clipping, a second accumulation
    pass over the step's SFT chunk adds ``coef × NLL`` gradients with its own global token normaliser.

    Args:
        sft_rows: this rank's SFT rows for the whole training step (rollout layout, see :mod:`hybridrl.data.sft`).
        num_mini_batches: optimizer steps per epoch; ``sft_rows`` is cut into that many equal chunks, chunk ``i``
            going with mini-batch ``i`` of every epoch.
        sft_loss: the SFT loss (token-mean NLL), scaled here by ``coef`` (``actor.ptx.coef``).
    """

    def __init__(self, sft_rows: Batch, num_mini_batches: int, sft_loss: Loss, coef: float) -> None:
        if len(sft_rows) % num_mini_batches:
            raise ValueError(f"{len(sft_rows)} SFT rows on this rank do not split into {num_mini_batches} "
                             "mini-batches; actor.ptx.batch_size must be a multiple of DP ranks × mini-batches")
        self.chunks = sft_rows.split([len(sft_rows) // num_mini_batches] * num_mini_batches)
        self.loss = Scaled(sft_loss, coef, "ptx/")

    def before_clip(self, engine: EngineView, mini_batch_index: int) -> dict[str, float]:
        return engine.accumulate_gradients(self.chunks[mini_batch_index], self.loss)


class EWCRegularizer(StepHook):
    """Elastic weight consolidation against the weights at construction time (see the module docstring); as a hook it
    adds its gradient before every clip. ``dp``: the ranks the model's shards are spread over (FSDP2's, all of them
    also when groups of them split sequences), over which the penalty is summed."""

    def __init__(self, model: nn.Module, coef: float, dp: DataParallelGroup) -> None:
        self.coef, self.dp = coef, dp
        named = [(name, param) for name, param in model.named_parameters() if param.requires_grad]
        self.names = [name for name, _ in named]
        self.params = [param for _, param in named]
        self.anchor = [_local(param).detach().clone() for param in self.params]
        self.fisher: Optional[list[torch.Tensor]] = None

    def _sharded_state(self) -> dict[str, torch.Tensor]:
        """``θ*`` and ``F`` laid out like their parameters (DTensors over the local shards, no copy), so DCP saves
        and reshards them like the model; keyed ``anchor/<param>`` and ``fisher/<param>``."""
        assert self.fisher is not None, "estimate_fisher first"
        state = {}
        for name, param, anchor, fisher in zip(self.names, self.params, self.anchor, self.fisher):
            state[f"anchor/{name}"], state[f"fisher/{name}"] = like_param(param, anchor), like_param(param, fisher)
        return state

    def save(self, directory: Path) -> None:
        """Write ``θ*`` and ``F`` with DCP (every rank its shards)."""
        dcp.save(self._sharded_state(), checkpoint_id=str(directory))

    @classmethod
    def load(cls, directory: Path, model: nn.Module, coef: float, dp: DataParallelGroup) -> "EWCRegularizer":
        """The regulariser ``save`` wrote, for ``model`` sharded over ``dp`` (any DP size)."""
        ewc = cls(model, coef, dp)
        ewc.fisher = [torch.zeros_like(anchor) for anchor in ewc.anchor]
        dcp.load(ewc._sharded_state(), checkpoint_id=str(directory))  # fills anchor and fisher in place
        return ewc

    def estimate_fisher(self, engine: EngineView, batches: list[Batch], nll_loss: Loss) -> None:
        """``F = mean_k (∇ NLL_k)²`` over ``batches`` (this rank's part of each; every rank passes as many), each
        accumulated by ``engine`` as one mini-batch."""
        fisher = [torch.zeros_like(anchor) for anchor in self.anchor]
        for batch in batches:
            engine.accumulate_gradients(batch, nll_loss)
            for total, param in zip(fisher, self.params):
                if param.grad is not None:
                    total += _local(param.grad).detach().pow(2) / len(batches)
                param.grad = None
        self.fisher = fisher

    def penalty(self) -> float:
        """``λ/2 Σ F (θ − θ*)²`` over all ranks (for logging)."""
        assert self.fisher is not None, "estimate_fisher first"
        total = sum(float((f * (_local(p).detach() - a).pow(2)).sum())
                    for f, p, a in zip(self.fisher, self.params, self.anchor))
        return 0.5 * self.coef * float(self.dp.sum(torch.tensor([total], dtype=torch.float64)))

    def add_gradient(self) -> dict[str, float]:
        """Add ``λ F (θ − θ*)`` to every trainable parameter's gradient shard; returns ``{"ewc/penalty": ...}``."""
        assert self.fisher is not None, "estimate_fisher first"
        for fisher, param, anchor in zip(self.fisher, self.params, self.anchor):
            term = self.coef * fisher * (_local(param).detach() - anchor)
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            _local(param.grad).add_(term)
        return {"ewc/penalty": self.penalty()}

    def before_clip(self, engine: EngineView, mini_batch_index: int) -> dict[str, float]:
        return self.add_gradient()


def like_param(param: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` (this rank's shard) as a tensor with ``param``'s global layout: a DTensor view if ``param`` is one."""
    if isinstance(param, DTensor):
        return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False, shape=param.shape,
                                  stride=param.stride())
    return local
