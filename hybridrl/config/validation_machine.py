"""Config checks only this machine can answer: installed backends, visible devices, files on disk, CPU limits.

Skipped (except the CPU limits a config states itself) when a config is composed elsewhere with ``check_paths=False``
(recipes validated in CI for GPU clusters).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Optional

from hybridrl.config.router_replay_checks import check_router_replay_model
from hybridrl.config.sequence_parallel_checks import check_sequence_parallel_heads
from hybridrl.config.vision_checks import check_vision_policy
from hybridrl.config.checks import _require, critic_enabled
from hybridrl.config.errors import ConfigError
from hybridrl.config.rollout_placement import colocated_replicas
from hybridrl.config.precision import check_precision_on_device
from hybridrl.config.rollout_schema import CPU_KV_BLOCK_SIZE
from hybridrl.config.schema import TrainConfig
from hybridrl.config.sizes import AUTO_MICRO_BATCH
from hybridrl.config.rollout_placement import replicas_apart
from hybridrl.config.vllm_architectures import vllm_support
from hybridrl.utils.host_memory import host_memory_mb

DATA_FILE_SUFFIXES = (".parquet", ".jsonl", ".json")
TRACKER_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow", "tensorboard": "tensorboard",
                    "prometheus": "prometheus_client"}


def _check_cpu_limits(config: TrainConfig, error: ConfigError) -> None:
    """What a CPU run cannot do: float16 training, fp8 compute, ``auto`` micro-batches without a budget, or vLLM KV
    blocks its CPU attention does not take."""
    if config.model.dtype == "float16":
        error.add("model.dtype", "float16", "float16 training is not supported on CPU; use bfloat16 or float32")
    if config.model.fp8_compute:
        error.add("model.fp8_compute", True, "fp8 compute needs a Hopper GPU (compute capability >= 9.0), not a CPU")
    block_size = config.rollout.block_size
    if config.rollout.name == "vllm" and block_size is not None and block_size > 0 and block_size % CPU_KV_BLOCK_SIZE:
        error.add("rollout.block_size", block_size, "vLLM's CPU attention takes blocks of a multiple of "
                  f"{CPU_KV_BLOCK_SIZE} tokens (or leave it null: {CPU_KV_BLOCK_SIZE} on CPU)")
    for role in ["actor"] + (["critic"] if critic_enabled(config) else []):
        role_config = getattr(config, role)
        if role_config.ppo_micro_batch_size_per_gpu == AUTO_MICRO_BATCH and not role_config.use_dynamic_bsz \
                and role_config.micro_batch_sizing.memory_budget_mb is None:
            error.add(f"{role}.micro_batch_sizing.memory_budget_mb", None,
                      f"is required on CPU with {role}.ppo_micro_batch_size_per_gpu=auto (CPU has no allocator "
                      "statistics to read a budget from)")


def _check_this_machine(config: TrainConfig, error: ConfigError) -> None:
    """What only this machine can tell: installed backends and visible devices (skipped for recipes composed
    elsewhere with ``check_paths=False``)."""
    if config.rollout.name == "vllm" and importlib.util.find_spec("vllm") is None:
        error.add("rollout.name", "vllm", "vLLM is not installed: pip install 'hybridrl[vllm]' (GPU) or "
                                          "'hybridrl[cpu]' (CPU build), or use rollout.name=hf")
    if config.model.attn_implementation == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        error.add("model.attn_implementation", "flash_attention_2",
                  "flash-attn is not installed (pip install 'hybridrl[gpu]' on a CUDA machine); sdpa is the portable choice")
    if config.model.lora.rank > 0 and importlib.util.find_spec("peft") is None:
        error.add("model.lora.rank", config.model.lora.rank, "LoRA needs PEFT: pip install 'hybridrl[lora]'")
    for name in config.trainer.logger:
        package = TRACKER_PACKAGES.get(name)
        if package is not None and importlib.util.find_spec(package) is None:
            error.add("trainer.logger", name, f"needs the {package} package, which is not installed here "
                      f"(pip install 'hybridrl[tracking]'), or drop {name!r} from trainer.logger")
    device = resolved_device(config)
    if device == "cuda" and config.trainer.ray.address == "local":  # a private instance has this machine's devices
        import torch

        visible, wanted = torch.cuda.device_count(), config.trainer.n_gpus_per_node
        if visible == 0:
            error.add("trainer.device", "cuda", "no CUDA device is visible on this machine; use trainer.device=cpu or auto")
        elif config.trainer.nnodes * wanted > visible:
            error.add("trainer.n_gpus_per_node", wanted, f"asks for {config.trainer.nnodes * wanted} GPUs but this "
                                                         f"machine has {visible} (a private Ray instance uses only them)")
        elif config.trainer.nnodes * wanted + config.rollout.n_gpus > visible:
            error.add("rollout.n_gpus", config.rollout.n_gpus,
                      f"a rollout pool of {config.rollout.n_gpus} beside the trainer's {wanted} needs "
                      f"{wanted + config.rollout.n_gpus} GPUs but this machine has {visible}")
    if config.trainer.device == "auto" and device == "cpu":
        _check_cpu_limits(config, error)
    _check_object_store(config, error)
    _check_weight_channel(config, device, error)
    _check_precision_here(config, device, error)


def _check_object_store(config: TrainConfig, error: ConfigError) -> None:
    """A private Ray instance's object store must fit this machine's memory (Ray's own refusal prints negative GB)."""
    wanted = config.trainer.ray.object_store_memory_mb
    if config.trainer.ray.address != "local" or wanted is None:
        return
    total_mb = host_memory_mb()
    if wanted >= total_mb:
        error.add("trainer.ray.object_store_memory_mb", wanted,
                  f"is more than this machine's memory ({total_mb} MiB); a few hundred MiB to a few GiB is usual")


def _check_weight_channel(config: TrainConfig, device: str, error: ConfigError) -> None:
    """The ``collective`` weight transport runs over NCCL on GPU, which joins each device once per group: a replica
    colocated on the actor's devices (``rollout.engine_process=own``) would join the same device twice."""
    if device == "cuda" and config.rollout.weight_transfer == "collective" and colocated_replicas(config):
        error.add("rollout.weight_transfer", "collective", "on GPU it runs over NCCL, which cannot join an actor "
                  "rank and a replica on the same device (rollout.engine_process=own shares the actor's devices); "
                  "use shared_memory, or a standalone pool (rollout.n_gpus > 0)")


def _check_precision_here(config: TrainConfig, device: str, error: ConfigError) -> None:
    """8-bit optimizer backends and fp8 compute (Hopper) on this machine's device."""
    capability = None
    if device == "cuda" and config.model.fp8_compute:
        import torch

        capability = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None
    optim_keys = {f"{role}.optim.state_precision": getattr(config, role).optim.state_precision
                  for role in ("actor", "critic") if role == "actor" or critic_enabled(config)}
    # fp8 on a CPU is reported by _check_cpu_limits; a GPU that is not visible here (a remote cluster) is checked
    # when the model is built.
    check_precision_on_device(optim_keys, config.model.fp8_compute and capability is not None, device, capability,
                              error)


def model_positions(model_config: dict) -> Optional[int]:
    """The positions a model's ``config.json`` gives it (its language model's, for a multimodal one), if it says."""
    model_config = model_config.get("text_config", model_config)
    positions = model_config.get("max_position_embeddings", model_config.get("n_positions"))
    return positions if isinstance(positions, int) else None


def resolved_device(config: TrainConfig) -> str:
    """``trainer.device`` with ``auto`` resolved on this machine: ``cuda`` when a CUDA device is visible, else ``cpu``."""
    if config.trainer.device != "auto":
        return config.trainer.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _check_paths(config: TrainConfig, error: ConfigError) -> None:
    _check_model_dir(error, "model.path", config.model.path)
    if not error:
        _check_model_fits(config, error)
    _check_run_dir(error, "trainer.default_local_dir", config.trainer.default_local_dir)
    if config.model.tokenizer_path is not None:
        _require(error, "model.tokenizer_path", config.model.tokenizer_path, Path(config.model.tokenizer_path).is_dir(),
                 "is not a directory")
    if critic_enabled(config) and config.critic.model_path is not None:
        _check_model_dir(error, "critic.model_path", config.critic.model_path)
    if config.reward_model.enable and config.reward_model.model_path:
        _check_model_dir(error, "reward_model.model_path", config.reward_model.model_path)
    for key in ("train_files", "val_files"):
        for path in getattr(config.data, key):
            _check_data_file(error, f"data.{key}", path)
    for path in config.actor.ptx.train_files:
        _check_data_file(error, "actor.ptx.train_files", path)
    reward_path = config.custom_reward_function.path
    if reward_path is not None:
        _require(error, "custom_reward_function.path", reward_path,
                 Path(reward_path).is_file() and reward_path.endswith(".py"), "must be an existing .py file")
    if config.trainer.resume_mode == "resume_path" and config.trainer.resume_from_path:
        resume_dir = Path(config.trainer.resume_from_path)
        _require(error, "trainer.resume_from_path", config.trainer.resume_from_path, resume_dir.is_dir(),
                 "is not a directory")
        _require(error, "trainer.resume_from_path", config.trainer.resume_from_path,
                 not resume_dir.is_dir() or (resume_dir / "trainer_state.pt").is_file(),
                 "is not a hybridrl checkpoint (no trainer_state.pt); point it at checkpoints/global_step_<k>")


def _check_model_fits(config: TrainConfig, error: ConfigError) -> None:
    """What the model can hold against what the run asks of it: every token id the tokenizer can produce must index
    the embedding (a smaller vocabulary fails at the first forward, deep inside it), and the longest sequence must fit
    the model's positions."""
    import json

    model_config = json.loads((Path(config.model.path) / "config.json").read_text(encoding="utf-8"))
    if config.rollout.name == "vllm":
        _check_vllm_serves(config, model_config.get("architectures") or [], error)
    check_vision_policy(config, model_config, error)
    model_config = model_config.get("text_config", model_config)  # multimodal configs nest the language model's
    longest = config.data.max_prompt_length + config.data.max_response_length
    positions = model_positions(model_config)
    if positions is not None and longest > positions:
        error.add("data.max_response_length", config.data.max_response_length,
                  f"data.max_prompt_length + data.max_response_length = {longest} tokens, but the model at model.path "
                  f"has {positions} positions (max_position_embeddings); shorten one of them")
    vocab_size = model_config.get("vocab_size")
    _check_tensor_parallel_fits(config.rollout.tensor_model_parallel_size, model_config, error)
    check_sequence_parallel_heads(config, error)
    check_router_replay_model(config, model_config, error)
    tokenizer_tokens = _tokenizer_size(config.model.tokenizer_path or config.model.path, config.model.trust_remote_code)
    if isinstance(vocab_size, int) and tokenizer_tokens is not None and tokenizer_tokens > vocab_size:
        error.add("model.path", config.model.path,
                  f"the model's vocabulary has {vocab_size} ids but its tokenizer produces {tokenizer_tokens} "
                  "(model.tokenizer_path from another model?); the embedding cannot look them up")


def _check_vllm_serves(config: TrainConfig, architectures: list, error: ConfigError) -> None:
    """The installed vLLM must serve the model's architecture, and serve it apart from the trainer's process when it
    does so through its Transformers backend (``config/vllm_architectures.py``)."""
    for architecture in architectures:
        support = vllm_support(str(architecture))
        if support == "unsupported":
            error.add("rollout.name", "vllm", f"the installed vLLM does not serve {architecture} (the architecture of "
                                              "model.path); generate with rollout=hf, or install a vLLM that does")
        elif support == "transformers_backend" and not replicas_apart(config):
            error.add("rollout.engine_process", "actor", f"vLLM serves {architecture} through its Transformers "
                      "backend, which rewrites transformers' own model class in the process the engine runs in; in "
                      "the actor's process its training forward breaks. Run the engine in processes of its own "
                      "(rollout.engine_process=own or auto, or a standalone pool: rollout.n_gpus > 0) or generate "
                      "with rollout=hf")


def _check_tensor_parallel_fits(tp: int, model_config: dict, error: ConfigError) -> None:
    """``t_g`` must split the attention heads evenly, and the KV heads evenly or into whole replicas (vLLM repeats
    each KV head on ``t_g / H_kv`` ranks), and the vocabulary padded to vLLM's multiple of 64."""
    heads = model_config.get("num_attention_heads")
    kv_heads = model_config.get("num_key_value_heads") or heads
    vocab = model_config.get("vocab_size")
    key = "rollout.tensor_model_parallel_size"
    if tp <= 1 or not isinstance(heads, int):
        return
    if heads % tp:
        error.add(key, tp, f"must divide the model's {heads} attention heads (num_attention_heads)")
    elif isinstance(kv_heads, int) and kv_heads % tp and tp % kv_heads:
        error.add(key, tp, f"must divide the model's {kv_heads} KV heads (num_key_value_heads), or be a multiple of "
                           "them")
    elif isinstance(vocab, int) and (-(-vocab // 64) * 64) % tp:
        error.add(key, tp, f"must divide the model's vocabulary padded to a multiple of 64 ({-(-vocab // 64) * 64})")


def _tokenizer_size(path: str, trust_remote_code: bool) -> Optional[int]:
    """Token ids the tokenizer at ``path`` can produce (added tokens included); ``None`` when none loads there (the
    tokenizer checks at start-up say why)."""
    from transformers import AutoTokenizer

    try:
        return len(AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code))
    except Exception:  # noqa: BLE001 - reported with its own message when the trainer loads it
        return None


def _check_run_dir(error: ConfigError, key: str, path: str) -> None:
    """The run directory must be (or become) a directory this process can write."""
    run_dir = Path(path)
    if run_dir.exists() and not run_dir.is_dir():
        error.add(key, path, "is a regular file, not a directory")
        return
    ancestor = run_dir
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        error.add(key, path, f"cannot be created: {ancestor} is a regular file, not a directory")
    elif not os.access(ancestor, os.W_OK):
        error.add(key, path, f"is not writable ({ancestor} is read-only to this user)")


def _check_model_dir(error: ConfigError, key: str, path: str) -> None:
    if path in ("???", "", None):
        error.add(key, path, "is required: a local Hugging Face model directory")
    elif not Path(path).is_dir():
        error.add(key, path, "does not exist or is not a directory")
    elif not (Path(path) / "config.json").is_file():
        error.add(key, path, "is not a Hugging Face model directory (no config.json)")
    else:
        problem = _model_dir_problem(Path(path))
        if problem:
            error.add(key, path, problem)


WEIGHT_FILE_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "*.gguf")


def _model_dir_problem(path: Path) -> Optional[str]:
    """Why a directory with a ``config.json`` still cannot be loaded as a model (cheap checks only), else ``None``."""
    import json

    try:
        model_config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (ValueError, OSError) as json_error:
        return f"config.json is not valid JSON ({json_error})"
    if not isinstance(model_config, dict) or "model_type" not in model_config:
        return "config.json has no 'model_type': not a Hugging Face model config"
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_FILE_PATTERNS):
        return f"holds no weights (none of {', '.join(WEIGHT_FILE_PATTERNS)})"
    unknown = _unknown_model_type(model_config)
    if unknown:
        return unknown
    for weights in sorted(path.glob("*.safetensors")):
        damage = _safetensors_damage(weights)
        if damage:
            return f"{weights.name} {damage}"
    return None


def _unknown_model_type(model_config: dict) -> Optional[str]:
    """A ``model_type`` transformers does not know (and no ``auto_map`` to remote code): why, else ``None``."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = model_config["model_type"]
    if model_type in CONFIG_MAPPING_NAMES or "auto_map" in model_config:
        return None
    return (f"config.json has model_type={model_type!r}, which this transformers does not know (a newer "
            "transformers, or a model with remote code and model.trust_remote_code=true)")


def _safetensors_damage(path: Path) -> Optional[str]:
    """Why a ``.safetensors`` file cannot be complete (a header that does not parse, or data past the file's end)."""
    import json
    import struct

    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            (header_bytes,) = struct.unpack("<Q", handle.read(8))
            if 8 + header_bytes > size:
                return f"is truncated: its header claims {header_bytes} bytes, the file has {size}"
            header = json.loads(handle.read(header_bytes))
    except (struct.error, ValueError, UnicodeDecodeError):
        return "is not a safetensors file (its header does not parse)"
    end = max((entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"), default=0)
    if 8 + header_bytes + end > size:
        return f"is truncated: {8 + header_bytes + end} bytes expected, the file has {size}"
    return None


def _check_data_file(error: ConfigError, key: str, path: str) -> None:
    if not Path(path).is_file():
        error.add(key, path, "file does not exist")
    elif not path.endswith(DATA_FILE_SUFFIXES):
        error.add(key, path, f"unsupported format; expected one of {', '.join(DATA_FILE_SUFFIXES)}")
