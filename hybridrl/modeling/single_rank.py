"""Mixed precision on one rank without FSDP2: fp32 master parameters, forward and backward in the compute dtype.

On a one-rank mesh whose parameters stay gathered (``*.fsdp.gather_once``), FSDP2 has nothing to shard, gather or
reduce, yet it still costs hooks and copies on every forward (every decode step of HF generation too) and a gradient
copy-in, reduce call and copy-out per micro-batch. This module gives the same numerics with less work:

- the module keeps its fp32 parameters (the optimizer, clipping, checkpoints and weight sync see them as always);
- while a forward runs, each parameter slot holds a compute-dtype cast of its parameter (hooks on the root, on a
  PEFT model's base model for ``generate``, and with activation checkpointing on every decoder layer, which the
  backward re-runs by itself);
  floating inputs are cast to the compute dtype and the root's floating outputs to fp32, as FSDP2's
  ``MixedPrecisionPolicy(param_dtype, output_dtype=float32)`` does;
- inside :func:`casts_kept` (entered by ``parameters_kept_gathered``, i.e. once per optimizer step, log-prob pass or
  ``generate``) each parameter is cast once and the cast reused by every forward; the casts are autograd nodes, so
  every micro-batch's backward adds its compute-dtype gradient, cast to fp32, into the fp32 ``.grad`` — the
  accumulation FSDP2 does with ``reduce_dtype=float32``.

Same update bit for bit as a one-rank FSDP2 model (``tests/distributed/test_single_rank_precision.py``).
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch
from torch import nn

from hybridrl.modeling.model_builder import decoder_layers

_STATE_ATTRIBUTE = "_hybridrl_compute_casts"


class _CastAccumulatingGrad(torch.autograd.Function):
    """``param.to(dtype)`` whose backward adds the compute-dtype gradient straight into ``param.grad``.

    Autograd's own way is two passes over every gradient per micro-batch: the cast's backward makes an fp32 copy,
    then the leaf's accumulation adds it into ``.grad``. One mixed-dtype ``add_`` does both in one pass (the upcast is
    exact, so the bits are the same); the first micro-batch's gradient is one cast copy, as before.
    """

    @staticmethod
    def forward(ctx, param: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        ctx.param = param
        return param.to(dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        param = ctx.param
        if param.grad is None:
            param.grad = torch.empty_like(param).copy_(grad)
        else:
            param.grad.add_(grad)
        return None, None


def _compute_cast(param: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A trainable parameter's cast accumulates its gradient itself (:class:`_CastAccumulatingGrad`); others plain."""
    if param.requires_grad and torch.is_grad_enabled() and param.dtype != dtype:
        return _CastAccumulatingGrad.apply(param, dtype)
    return param.to(dtype)


class _ComputeCasts:
    """Which parameter slots of a model get a compute-dtype cast during forward, and the casts kept (if any)."""

    def __init__(self, model: nn.Module, compute_dtype: torch.dtype) -> None:
        self.compute_dtype = compute_dtype
        self.slots = [(module, name, param) for module in model.modules()
                      for name, param in module._parameters.items()
                      if param is not None and param.is_floating_point()]
        self.kept: Optional[dict[int, torch.Tensor]] = None
        self.depth = 0
        self.open_calls: dict[int, int] = {}  # id(module) → its forwards that entered and have not exited

    def _casts(self) -> dict[int, torch.Tensor]:
        if self.kept:  # cast earlier inside casts_kept
            return self.kept
        casts = {}
        for _, _, param in self.slots:
            if id(param) not in casts:  # a tied parameter is cast once: both uses feed one gradient
                casts[id(param)] = _compute_cast(param, self.compute_dtype)
        if self.kept is not None:
            self.kept.update(casts)
        return casts

    def enter(self, caller: nn.Module) -> None:
        """Before ``caller``'s forward: swap the casts in (outermost forward only). If casting fails (e.g. out of
        memory) nothing is counted, so the ``exit`` that runs anyway leaves the count as it was."""
        if self.depth == 0:
            casts = self._casts()
            for module, name, param in self.slots:
                module._parameters[name] = casts[id(param)]
        self.depth += 1
        self.open_calls[id(caller)] = self.open_calls.get(id(caller), 0) + 1

    def exit(self, caller: nn.Module) -> None:
        """After ``caller``'s forward (also a failed one): the parameters back once the outermost forward ends."""
        if not self.open_calls.get(id(caller)):
            return  # its ``enter`` did not complete
        self.open_calls[id(caller)] -= 1
        self.depth -= 1
        if self.depth == 0:
            self.restore()

    def restore(self) -> None:
        for module, name, param in self.slots:
            module._parameters[name] = param
        self.depth, self.open_calls = 0, {}


def _cast_floats(value: Any, dtype: torch.dtype) -> Any:
    """``value`` with every floating tensor in it (through dicts, ``ModelOutput``s, dataclasses, lists and tuples)
    cast to ``dtype``; anything else (e.g. a KV cache object) unchanged."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if type(value) is dict:
        return {key: _cast_floats(item, dtype) for key, item in value.items()}
    if isinstance(value, dict):  # a ModelOutput (built by the forward itself): assigning a key also sets its attribute
        for key in list(value.keys()):
            value[key] = _cast_floats(value[key], dtype)
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {field.name: _cast_floats(getattr(value, field.name), dtype) for field in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_cast_floats(item, dtype) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_floats(item, dtype) for item in value)
    return value


def apply_compute_dtype(model: nn.Module, compute_dtype: torch.dtype) -> nn.Module:
    """Make ``model`` (fp32 parameters, one process) run forward and backward in ``compute_dtype``; returns it.

    A no-op when ``compute_dtype`` is the parameters' dtype. The root's floating outputs come back in fp32.
    """
    if all(param.dtype == compute_dtype for param in model.parameters()):
        return model
    casts = _ComputeCasts(model, compute_dtype)
    setattr(model, _STATE_ATTRIBUTE, casts)

    def before(module, args, kwargs):
        casts.enter(module)
        return _cast_floats(args, compute_dtype), _cast_floats(kwargs, compute_dtype)

    def after(module, args, kwargs, output):
        casts.exit(module)
        return _cast_floats(output, torch.float32) if module is model else output

    hooked = [model]
    if hasattr(model, "get_base_model"):  # PEFT: generate() calls the HF model below the root
        hooked.append(model.get_base_model())
    for module in hooked:
        module.register_forward_pre_hook(before, with_kwargs=True)
        module.register_forward_hook(after, with_kwargs=True, always_call=True)
    if _checkpoints_activations(model):  # backward re-runs layers by themselves; kept out of torch.compile's graphs
        for layer in decoder_layers(model):
            layer.register_forward_pre_hook(torch.compiler.disable(before), with_kwargs=True)
            layer.register_forward_hook(torch.compiler.disable(after), with_kwargs=True, always_call=True)
    return model


def _checkpoints_activations(model: nn.Module) -> bool:
    return any(getattr(module, "gradient_checkpointing", False) is True for module in model.modules())


def has_compute_casts(model: nn.Module) -> bool:
    """Whether :func:`apply_compute_dtype` gave ``model`` a compute dtype of its own."""
    return hasattr(model, _STATE_ATTRIBUTE)


@contextmanager
def casts_kept(model: nn.Module) -> Iterator[None]:
    """Inside, each parameter is cast to the compute dtype once (at the first forward) and the cast reused by every
    forward; on exit the casts are dropped. Cast under the grad mode of that first forward: inside a training step
    every micro-batch's backward flows through the same cast into the fp32 gradient. Leave before the optimizer
    step (the casts would be stale). A model without :func:`apply_compute_dtype` passes through unchanged."""
    casts: Optional[_ComputeCasts] = getattr(model, _STATE_ATTRIBUTE, None)
    if casts is None or casts.kept is not None:
        yield
        return
    casts.kept = {}
    try:
        yield
    finally:
        casts.kept = None
        if casts.depth:  # a forward did not unwind (it cannot, short of a bug): never leave the casts swapped in
            casts.restore()


@contextmanager
def compute_parameters_in_place(model: nn.Module) -> Iterator[None]:
    """Inside, each parameter slot of ``model`` holds its compute-dtype cast, as during a forward (the casts kept by
    an enclosing :func:`casts_kept`, else made here): for code that reads the weights outside a forward, such as
    :class:`hybridrl.modeling.decode_step.DecodeStep`. A model without :func:`apply_compute_dtype` passes through."""
    casts: Optional[_ComputeCasts] = getattr(model, _STATE_ATTRIBUTE, None)
    if casts is None:
        yield
        return
    casts.enter(model)
    try:
        yield
    finally:
        casts.exit(model)
