"""hybridrl: HybridFlow-style single-controller RL post-training for LLMs (PPO, GRPO) on Ray, FSDP2 and vLLM."""

__version__ = "0.1.0.dev0"
