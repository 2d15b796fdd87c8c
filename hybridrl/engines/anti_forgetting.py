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
from typing import Callable, Optional

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.tensor import DTensor

from hybridrl.protocol import Batch
from hybridrl.engines.accumulation import DataParallelGroup, MicroBatching, MicroBatchLoss, accumulate_gradients

EWC_DIR = "ewc"
"""Where an actor checkpoint keeps EWC's anchor and Fisher (a DCP directory)."""


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a (possibly DTensor) parameter or gradient, as a plain tensor sharing its storage."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def scaled(loss_fn: MicroBatchLoss, coef: float, prefix: str) -> MicroBatchLoss:
    """``coef × loss_fn``, with its metrics renamed ``{prefix}{name}``."""

    def loss(micro_batch: Batch, normalizer: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        value, metrics = loss_fn(micro_batch, normalizer)
        return coef * value, {f"{prefix}{name}": metric for name, metric in metrics.items()}

    return loss


class PtxMixer:
    """The SFT term of each optimizer step (``before_step`` hook of ``train_epochs``).

    Args:
        model: the (sharded) policy.
        sft_rows: this rank's SFT rows for the whole step (rollout layout, see ``hybridrl.data.sft``).
        num_mini_batches: optimizer steps per epoch; ``sft_rows`` is cut into that many equal chunks.
        sft_loss: the engine's SFT micro-batch loss (token-mean NLL with the global normaliser).
        coef: ``actor.ptx.coef``.
    """

    def __init__(self, model: nn.Module, sft_rows: Batch, num_mini_batches: int, sft_loss: MicroBatchLoss,
                 coef: float, micro_batching: MicroBatching, dp: DataParallelGroup) -> None:
        if len(sft_rows) % num_mini_batches:
            raise ValueError(f"{len(sft_rows)} SFT rows on this rank do not split into {num_mini_batches} "
                             "mini-batches; actor.ptx.batch_size must be a multiple of DP ranks × mini-batches")
        self.model, self.dp, self.micro_batching = model, dp, micro_batching
        self.chunks = sft_rows.split([len(sft_rows) // num_mini_batches] * num_mini_batches)
        self.loss_fn = scaled(sft_loss, coef, "ptx/")

    def __call__(self, mini_batch_index: int) -> dict[str, float]:
        return accumulate_gradients(self.model, self.chunks[mini_batch_index], self.loss_fn,
                                    loss_agg_mode="token-mean", micro_batching=self.micro_batching, dp=self.dp)


class EWCRegularizer:
    """Elastic weight consolidation against the weights at construction time (see the module docstring)."""

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

    def estimate_fisher(self, model: nn.Module, batches: list[Batch], nll_loss: MicroBatchLoss,
                        micro_batching: MicroBatching) -> None:
        """``F = mean_k (∇ NLL_k)²`` over ``batches`` (this rank's part of each; every rank passes as many)."""
        fisher = [torch.zeros_like(anchor) for anchor in self.anchor]
        for batch in batches:
            accumulate_gradients(model, batch, nll_loss, loss_agg_mode="token-mean", micro_batching=micro_batching,
                                 dp=self.dp)
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


def like_param(param: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` (this rank's shard) as a tensor with ``param``'s global layout: a DTensor view if ``param`` is one."""
    if isinstance(param, DTensor):
        return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False, shape=param.shape,
                                  stride=param.stride())
    return local


def combine_hooks(*hooks: Optional[Callable[[int], dict[str, float]]]) -> Optional[Callable[[int], dict]]:
    """One ``before_step(index)`` running each given hook in order (``None`` if none is given)."""
    active = [hook for hook in hooks if hook is not None]
    if not active:
        return None

    def run(index: int) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for hook in active:
            metrics.update(hook(index))
        return metrics

    return run
