"""hybridrl: HybridFlow-style single-controller RL post-training for LLMs (PPO, GRPO) on Ray, FSDP2 and vLLM."""

import logging as _logging

__version__ = "0.1.0.dev0"

# `transformers` imports torchao whenever it is installed (the `lowbit`/`test` extras), and torchao then warns, in
# every worker process, about CUDA kernels it cannot load on a CPU machine and about enum registrations deprecated by
# torch. Neither concerns a user; real errors still get through (level ERROR).
for _noisy in ("torchao", "torch.utils._pytree"):
    _logging.getLogger(_noisy).setLevel(_logging.ERROR)
