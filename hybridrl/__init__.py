"""hybridrl: HybridFlow-style single-controller RL post-training for LLMs (PPO, GRPO) on Ray, FSDP2 and vLLM."""

import logging as _logging
import warnings as _warnings

__version__ = "0.1.0.dev0"

# `transformers` imports torchao whenever it is installed (the `lowbit`/`test` extras), and torchao then warns, in
# every worker process, about CUDA kernels it cannot load on a CPU machine and about enum registrations deprecated by
# torch; torch warns on CPU that Triton is absent. None of it concerns a user; real errors still get through (ERROR).
for _noisy in ("torchao", "torch.utils._pytree", "torch._library.triton"):
    _logging.getLogger(_noisy).setLevel(_logging.ERROR)
# vLLM's own code uses a torch alias deprecated upstream; the warning is vLLM's to fix, and it repeats on every rank.
_warnings.filterwarnings("ignore", message=r"`torch\.distributed\.reduce_op` is deprecated", category=FutureWarning)
