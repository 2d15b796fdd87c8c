"""The ``rollout.*`` section of the training config: the generation engine, its sampling and its vLLM settings
(re-exported by :mod:`hybridrl.config.schema`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hybridrl.config.frozen import FreezableConfig
from hybridrl.config.multi_turn_schema import MultiTurnConfig


@dataclass
class SamplingConfig(FreezableConfig):
    n: int = 1
    """Responses per prompt during validation."""
    do_sample: bool = False
    """Sample (true) or decode greedily (false) during validation."""
    temperature: float = 1.0
    """Sampling temperature when ``do_sample`` is true."""
    top_p: float = 1.0
    """Nucleus sampling mass when ``do_sample`` is true."""
    top_k: int = -1
    """Top-k sampling when ``do_sample`` is true (-1 disables)."""


WEIGHT_TRANSFERS = ("auto", "shared_memory", "plan", "gather", "object_store", "collective")
IN_PLACE_TRANSFERS = ("auto", "shared_memory", "plan", "gather")  # into engines in the actor's processes
PUBLISHED_TRANSFERS = ("auto", "shared_memory", "object_store", "collective")  # to replicas in processes of their own

CPU_KV_BLOCK_SIZE = 32
"""``rollout.block_size`` when unset on CPU, and what a vLLM KV block on CPU must be a multiple of (its CPU attention
backend's constraint, vLLM 0.32)."""


@dataclass
class RolloutConfig(FreezableConfig):
    name: str = "hf"
    """Generation engine: ``hf`` (a KV-cached decode loop on the actor's module) | ``vllm`` (vLLM, in the actor's
    processes or in its own: ``engine_process``)."""
    n: int = 1
    """Responses per prompt (the group size of GRPO/RLOO)."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts (> 0)."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    top_k: int = -1
    """Top-k sampling (-1 disables)."""
    seed: Optional[int] = None
    """Base sampling seed, combined with the step and the rank so every step samples afresh; ``null`` = ``trainer.seed``."""
    tensor_model_parallel_size: int = 1
    """Tensor-parallel size t_g of the generation layout; must divide the number of devices."""
    n_gpus: int = 0
    """Devices of a standalone rollout pool (split placement): ``0`` (default) generates on the actor's devices (the
    hybrid engine, weights resharded in place); ``M > 0`` runs ``M / tensor_model_parallel_size`` vLLM replicas on
    ``M`` devices of their own beside the trainer's ``trainer.n_gpus_per_node`` (weights reach them by
    ``weight_transfer``, checked). What asynchronous training overlaps; on its own it only adds devices."""
    engine_process: str = "auto"
    """Where a colocated vLLM engine (``n_gpus = 0``) runs: ``actor`` (inside each actor rank's process, the
    tensor-parallel ranks in lockstep: the resharder slices weights straight into it), ``own`` (each replica in
    processes of its own on the actor's devices, as a standalone pool's are: vLLM's process-wide changes stay out of
    training, and its weights arrive through ``weight_transfer``, checked) or ``auto`` (``own`` for an architecture
    vLLM serves through its Transformers backend, which rewrites transformers' model class in the process the engine
    runs in; ``actor`` otherwise, measured the faster on one host: ``benchmarks/placement.py``). A standalone
    pool's replicas always run in their own processes. On GPU an ``own`` replica shares its device with the actor
    and sleeps while the actor trains (``free_cache_engine``)."""
    weight_transfer: str = "auto"
    """How the trainer's new weights reach the engines — one key for every placement. Into engines in the actor's
    processes (resharded in place): ``shared_memory`` (CPU, all ranks on one host: each rank casts its FSDP shard
    into one host-shared copy of the model in ``/dev/shm`` and each engine reads its slices in place), ``plan``
    (point-to-point messages of exactly each rank's tensor-parallel slices: gloo on CPU, NCCL on GPU) or ``gather``
    (all-gathers, ``tensor_model_parallel_size=1`` only). To replicas in processes of their own (a standalone pool,
    or ``engine_process=own``; published, then loaded): ``shared_memory`` (one host-shared copy the replicas read in
    place: the replicas on the trainer's host; on GPU through host memory — there is no CUDA IPC transfer yet),
    ``object_store`` (each trainer rank puts its rows into Ray's object store and the replicas fetch them, across
    nodes over the network) or ``collective`` (each trainer rank sends its rows to each replica's ranks over a
    process group of their own: gloo over TCP on CPU, NCCL on GPU — across nodes; the NCCL path is tested only on a
    machine with 2 GPUs, not yet measured; set ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` where the nodes'
    default interface is not the one they share). ``auto``: in the actor's processes ``shared_memory`` on CPU where
    the ranks can map one buffer, else ``plan``; to replicas ``shared_memory`` for a local Ray instance on one node,
    ``object_store`` when attached to a cluster or with ``trainer.nnodes > 1``. Partial rollout needs
    ``shared_memory``. Replaces ``weight_sync_method`` and ``weight_transport``."""
    weight_delta: bool = False
    """``weight_transfer=object_store`` or ``collective``: each trainer rank sends only the values of its rows whose
    bits changed since the version the replicas hold — their positions (or a bitmask, whichever is smaller) and new
    values — and its whole rows at the first sync, when a delta would not be under half of them, and every
    ``weight_delta_full_every`` versions. The replicas rebuild the rows bit for bit (``verify_weight_sync`` checks
    them as it checks a whole sync). On the SmolLM2-135M GSM8K recipe in bf16 (lr 1e-6) a delta carried 1.3-2.8 %
    of a whole sync's bytes (``benchmarks/delta_sync.py``: 1.4-13 % at lr 1e-6 to 1e-5). It costs memory — a copy
    of the rows on each trainer rank, of the whole model on each replica rank — and encoding time, 2.5-6x one copy
    of the rows: it pays where bytes are slow — between nodes. On one host through an object store that holds a whole
    publication a delta sync was 1.48x slower than a whole one (``benchmarks/delta_pool_sync.py``)."""
    weight_delta_full_every: int = 10
    """``weight_delta``: send the whole rows at least every this many versions (``1``: always whole)."""
    weight_transfer_timeout_s: float = 1800.0
    """``weight_transfer=collective``: how long the trainer's ranks and a replica's ranks wait for each other — to
    join at start, and for a posted send to be received. A replica receives new weights after the generation it is
    running (asynchronous training), so keep this above the longest generation; NCCL's watchdog ends a process whose
    send waited longer."""
    gpu_memory_utilization: float = 0.5
    """vLLM: fraction of device memory for weights + KV cache (GPU)."""
    kv_cache_memory_mb: Optional[int] = None
    """vLLM: KV-cache budget in MiB. Unset on CPU: sized to run ``rollout.max_num_seqs`` sequences of prompt + response
    length at once (logged; at most a quarter of host memory). Unset on GPU: vLLM sizes it from
    ``gpu_memory_utilization``. A budget that holds fewer sequences than a generation submits makes vLLM run it in
    waves; the engine warns once with the MiB that would fit."""
    enforce_eager: bool = True
    """vLLM: disable CUDA graphs (lower start-up cost and memory)."""
    max_num_seqs: int = 256
    """vLLM: maximum sequences per engine step."""
    max_num_batched_tokens: int = 8192
    """vLLM: maximum tokens per engine step."""
    free_cache_engine: bool = True
    """Release the engine's KV cache during training and restore it before generation (vLLM sleep/wake on GPU)."""
    enable_chunked_prefill: bool = True
    """vLLM: split long prompt prefills into chunks batched with decode steps (vLLM's ``enable_chunked_prefill``)."""
    enable_prefix_caching: bool = True
    """vLLM: reuse the KV cache of shared prompt prefixes (the ``n`` responses to one prompt share its prefill)."""
    block_size: Optional[int] = None
    """vLLM: tokens per KV-cache block. Prefix caching shares whole blocks, so the ``n`` responses to a prompt share
    its prefill up to its last full block. ``null``: 32 on CPU (the smallest block vLLM's CPU attention takes; its own
    CPU default, 128, shares nothing of a prompt shorter than 128 tokens, and each of the ``n`` copies is prefilled),
    vLLM's default on GPU. On CPU a multiple of 32."""
    load_format: str = "auto"
    """vLLM: how the engine reads ``model.path`` at start-up: ``auto`` | ``safetensors`` | ``pt`` (the files) or
    ``dummy`` (random weights, replaced by the actor's before the first generation: a faster start)."""
    weight_sync_bucket_mb: int = 256
    """Size of one bucket of streamed weights when resharding training weights into the engine."""
    verify_weight_sync: bool = True
    """Check every weight sync into an engine holding its own copy (vLLM): each piece is fingerprinted before it moves
    and again as the engine receives it, and a mismatch stops the run naming the parameter. Costs two passes of
    integer sums over this rank's slices (``benchmarks/weight_sync.py`` prints the share of a sync)."""
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling parameters used for validation."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Multi-turn agent episodes (``rollout.multi_turn.enable``)."""
    hf_fast_decode: bool = True
    """``rollout.name=hf``: run each decode step of a llama / mistral / qwen2 / qwen3 model straight on its weights
    (fused q/k/v and gate/up products, no module dispatch): the module forward's logits bit for bit on CPU, and
    generation 1.1× (SmolLM2-135M's shapes) to 1.3× (the demo's tiny model) faster there. Other models, and
    ``false``, run the module's forward every step (the log says which)."""
