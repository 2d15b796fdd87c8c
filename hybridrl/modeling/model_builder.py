"""Building the models each role trains or queries, from a local Hugging Face directory (never a download).

Roles: the actor and reference are ``AutoModelForCausalLM``; the critic is ``AutoModelForTokenClassification`` with one
label (a fresh linear value head over the causal LM's backbone); the reward model is
``AutoModelForSequenceClassification`` with one label. Parameters are loaded in fp32 (the master copy); lower-precision
compute comes from FSDP2's mixed-precision policy, not from the stored weights.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from hybridrl.config.auto_dtype import resolve_dtype
from hybridrl.config.schema import ModelConfig
from hybridrl.modeling.attention import attention_implementation
from hybridrl.modeling.fp8 import apply_fp8_compute
from hybridrl.utils.model_files import is_vision_language

logger = logging.getLogger(__name__)

ModelRole = Literal["actor", "reference", "critic", "reward_model"]
# Any one of these makes a directory a tokenizer directory (fast, sentencepiece, BPE vocab).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str, device_type: str = "cpu") -> torch.dtype:
    """``"bfloat16"`` → ``torch.bfloat16``; ``"auto"`` (a config built in code, not validated) → what
    ``config/auto_dtype.py`` picks for ``device_type``; a clear error for anything else."""
    if name == "auto":
        name = resolve_dtype(name, device_type, log=False)
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


def build_model(model_config: ModelConfig, role: ModelRole, *, path: str | None = None,
                device_type: str = "cpu") -> nn.Module:
    """Load the model for ``role`` from ``path`` (default ``model_config.path``) in fp32, on CPU, in train mode.

    The caller moves it to its device and wraps it with FSDP2 (``hybridrl.modeling.fsdp``). With
    ``model.lora.rank > 0`` the actor comes back wrapped in PEFT LoRA adapters (``hybridrl.modeling.lora``).
    """
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    model_path = path or model_config.path
    common = dict(
        dtype=torch.float32,
        attn_implementation=attention_implementation(model_config.attn_implementation, device_type,
                                                     torch_dtype(model_config.dtype, device_type)),
        trust_remote_code=model_config.trust_remote_code,
    )
    if role in ("actor", "reference"):
        model = policy_model_class(model_path).from_pretrained(model_path, **common)
    elif role == "critic":
        model = AutoModelForTokenClassification.from_pretrained(model_path, num_labels=1, **common)
    elif role == "reward_model":
        model = AutoModelForSequenceClassification.from_pretrained(model_path, num_labels=1, **common)
    else:
        raise ValueError(f"unknown model role {role!r}")
    if model_config.enable_gradient_checkpointing and role in ("actor", "critic"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    disable_dropout(model)
    if model_config.fp8_compute and role in ("actor", "critic"):  # before compile and FSDP wrap the layers
        apply_fp8_compute(model, torch.device(device_type))
    if role == "actor" and model_config.lora.rank > 0:
        from hybridrl.modeling.lora import apply_lora  # PEFT is an optional extra

        model = apply_lora(model, model_config.lora)
    if model_config.use_torch_compile and role in ("actor", "critic"):
        for layer in decoder_layers(model):  # per block, before FSDP wraps it (FSDP2 + compile compose per layer)
            layer.compile()
    if role == "reference":
        model.requires_grad_(False)
        model.eval()
    else:
        model.train()
    return model


def policy_model_class(model_path: str):
    """The ``AutoModelFor…`` class a policy at ``model_path`` is built with: ``AutoModelForImageTextToText`` for a
    vision-language model (its ``config.json`` has a ``vision_config``: Qwen2-VL, Qwen2.5-VL, …), else
    ``AutoModelForCausalLM``."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_language(model_path) else AutoModelForCausalLM


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout probability to 0 (the token-classification head defaults to 0.1).

    RL losses compare log-probs and values of the same tokens across passes (old vs new policy, rollout vs trainer);
    dropout would make those differ for no reason, and breaks run-to-run determinism.
    """
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    for attribute in ("attention_dropout", "hidden_dropout", "classifier_dropout"):
        if getattr(model.config, attribute, None):
            setattr(model.config, attribute, 0.0)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a Hugging Face model (the unit FSDP2 shards and activation checkpointing wraps): the
    classes it declares in ``_no_split_modules``, else — an encoder such as DeBERTa-v2/v3, a common reward model,
    declares none — the blocks of its largest ``nn.ModuleList`` of one block class."""
    no_split = set(getattr(model, "_no_split_modules", None) or [])
    layers = [module for module in model.modules() if type(module).__name__ in no_split]
    if layers:
        return layers
    stacks = [list(module) for module in model.modules() if isinstance(module, nn.ModuleList) and len(module)
              and len({type(block) for block in module}) == 1]
    if not stacks:
        raise ValueError(f"cannot find the transformer blocks of {type(model).__name__}: it declares no "
                         "_no_split_modules and holds no nn.ModuleList of blocks")
    return max(stacks, key=lambda blocks: sum(param.numel() for block in blocks for param in block.parameters()))


def load_tokenizer(model_config: ModelConfig):
    """The tokenizer of ``model.tokenizer_path`` (default ``model.path``), left-padded, with a pad token.

    A tokenizer without a pad token reuses its EOS token for padding (pads are masked everywhere).
    """
    from transformers import AutoTokenizer

    path = model_config.tokenizer_path or model_config.path
    key = "model.tokenizer_path" if model_config.tokenizer_path else "model.path"
    if not any((Path(path) / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"{key}={path!r}: holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                         "save one there or set model.tokenizer_path")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=model_config.trust_remote_code)
    except (OSError, ValueError, TypeError) as error:  # broken files: transformers' message, first line
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(f"{key}={path!r}: cannot load its tokenizer: {first_line}") from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"model.tokenizer_path={path!r}: the tokenizer has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
