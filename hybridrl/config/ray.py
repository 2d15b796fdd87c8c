"""Ray start-up and worker-group settings (``trainer.ray``).

``hybridrl.runtime.ray_runtime.start_ray`` reads this; every field carries an attribute docstring (the config
reference is generated from them). ``validate()`` raises ``ValueError`` naming the offending ``trainer.ray.<field>``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hybridrl.config.frozen import FreezableConfig

LOGGING_LEVELS = ("debug", "info", "warning", "error", "critical")
# Ray refuses an object store smaller than this (ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES = 75 MiB).
MIN_OBJECT_STORE_MB = 75


@dataclass
class RayConfig(FreezableConfig):
    address: str = "local"
    """``local`` starts a private Ray instance for this process (never joins a stray cluster); ``auto`` or
    ``host:port`` attaches to a running cluster (then ``num_cpus``/``num_gpus`` must stay null)."""
    num_cpus: Optional[int] = None
    """Logical CPUs of the local instance (may exceed physical cores); ``null`` lets Ray count them."""
    num_gpus: Optional[int] = None
    """GPUs of the local instance; ``null`` lets Ray detect them."""
    object_store_memory_mb: int = 200
    """Object-store size of the local instance in MiB (bounded so tests and small machines stay small).
    Ignored when attaching to an existing cluster."""
    include_dashboard: bool = False
    """Start Ray's dashboard with the local instance."""
    logging_level: str = "warning"
    """Ray's log level: ``debug`` | ``info`` | ``warning`` | ``error`` | ``critical``."""
    local_mode: bool = False
    """Run workers in the controller process without Ray (the serial executor): each rank's worker object is built
    and called in turn, so a breakpoint in a worker method works. See ``hybridrl.runtime.executors``."""
    call_timeout_s: float = 1800.0
    """Seconds a worker-group call may take before the controller raises ``WorkerTimeoutError``."""
    placement_timeout_s: float = 120.0
    """Seconds to wait for a resource pool's placement groups before raising ``ResourceUnavailableError``."""
    startup_timeout_s: float = 300.0
    """Seconds a worker group may take to start (processes, ``torch.distributed`` init, user ``__init__``)."""
    failure_grace_s: float = 5.0
    """After one rank raises, seconds to wait for its peers to finish; peers still running after that are taken to be
    stuck (e.g. in a collective the failed rank never joined) and the whole group is stopped."""
    cpu_keep_freed_memory: bool = True
    """CPU workers: glibc's ``malloc`` serves large tensors from its heap and never trims it, instead of mapping
    fresh pages for each one and faulting them in again every micro-batch (SmolLM2-135M's update: 8.3 → 7.3 s on a
    2-core CPU). Resident memory then stays at the step's peak. ``false``: glibc's defaults."""
    cpu_kernel_cache_capacity: Optional[int] = 64
    """CPU workers: how many compiled matmul kernels oneDNN keeps (``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` and
    ``LRU_CACHE_CAPACITY``; their own default is 1024). Every new token count of a micro-batch or row count of a
    decode step compiles kernels that stay resident while cached, so with the defaults a run whose lengths vary
    grows its memory by hundreds of MiB before it levels off. A micro-batch's forward and backward use about 21
    kernels (SmolLM2-135M, bf16; 16 with LoRA on every projection), a decode step 5. SmolLM2-135M's GRPO step in
    bf16 on 2 CPU cores (``benchmarks/vs_trl.py``, 6 steps): peak PSS 4958–5074 MiB with oneDNN's defaults,
    4550–4628 at 64, at the same step time. ``null``: oneDNN's defaults. ``worker_env``, or either variable
    exported where the controller runs, wins over it; in ``local_mode`` set the variables in your own environment."""
    idle_worker_processes: int = 4
    """How many worker processes a worker group that shut down cleanly may leave waiting, with its pool's
    reservation, for the next group on the same devices in this Ray instance: that group then starts without
    starting processes or importing torch, transformers and vLLM again (a 2-rank group: 5.5 s → 1.5 s on a 2-core
    CPU). It matters when one controller runs several jobs (``hybridrl demo``'s SFT then GRPO, a notebook, the test
    suite); a single ``hybridrl train`` ends them at exit. Waiting processes hold their memory (and a GPU process its
    CUDA context), and their reservations stay beside new pools, until a new pool finds no room beside them, Ray
    stops, or
    ``hybridrl.runtime.release_parked_workers()`` is called. A restart after a lost worker always starts fresh
    processes. ``0``: every group's processes end with it."""
    worker_env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for every worker process (merged over hybridrl's defaults; ``PYTHONPATH``
    entries are prepended to the one that makes ``hybridrl`` importable)."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid ``trainer.ray.<field>``."""
        if not self.address:
            _fail("address", self.address, "must be 'local', 'auto' or 'host:port'")
        attaching = self.address != "local"
        for name in ("num_cpus", "num_gpus"):
            value = getattr(self, name)
            if value is not None and value < (1 if name == "num_cpus" else 0):
                _fail(name, value, "must be null or a positive count")
            if value is not None and attaching and not self.local_mode:
                _fail(name, value, f"must be null when attaching to a cluster (address={self.address!r}): "
                                   "the cluster's resources are fixed when it starts")
        if self.object_store_memory_mb < MIN_OBJECT_STORE_MB:
            _fail("object_store_memory_mb", self.object_store_memory_mb, f"Ray needs at least {MIN_OBJECT_STORE_MB}")
        if self.logging_level not in LOGGING_LEVELS:
            _fail("logging_level", self.logging_level, f"must be one of {', '.join(LOGGING_LEVELS)}")
        for name in ("call_timeout_s", "placement_timeout_s", "startup_timeout_s"):
            if not getattr(self, name) > 0:
                _fail(name, getattr(self, name), "must be > 0 seconds")
        if self.failure_grace_s < 0:
            _fail("failure_grace_s", self.failure_grace_s, "must be >= 0 seconds")
        if self.idle_worker_processes < 0:
            _fail("idle_worker_processes", self.idle_worker_processes, "must be >= 0 (0: no process is kept)")
        if self.cpu_kernel_cache_capacity is not None and self.cpu_kernel_cache_capacity < 1:
            _fail("cpu_kernel_cache_capacity", self.cpu_kernel_cache_capacity, "must be null or a positive count")
        for key, value in dict(self.worker_env).items():
            if not isinstance(key, str) or not isinstance(value, str) or not key:
                _fail("worker_env", {key: value}, "keys and values must be non-empty strings / strings")


def _fail(name: str, value: object, message: str) -> None:
    raise ValueError(f"trainer.ray.{name}={value!r}: {message}")
