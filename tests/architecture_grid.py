"""The architecture grid: which model families train through which rollout layouts. ``tests/e2e/test_architectures.py``
runs every case (2 GRPO steps, engine log-probs equal to the trainer's after each sync), and
``tests/readme_tables.py`` renders the README's supported-models table from the same lists, so the table says what the
tests run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class Family:
    """One tiny random model of the grid: its transformers ``model_type``, whether its output head is tied to the
    embeddings, and released models of that architecture (what a reader looks up; tying decides which row fits)."""

    architecture: str
    tied: bool
    examples: str


ZOO = {
    "llama": Family("llama", False, "Llama 3 / 3.1, TinyLlama"),
    "llama_tied": Family("llama", True, "SmolLM2, Llama 3.2"),
    "qwen2": Family("qwen2", False, "Qwen2.5 ≥ 7B"),
    "qwen2_tied": Family("qwen2", True, "Qwen2.5 ≤ 3B"),
    "qwen3": Family("qwen3", False, "Qwen3 (dense)"),
    "mistral": Family("mistral", False, "Mistral"),
    "gemma2": Family("gemma2", True, "Gemma 2"),
    "gemma3": Family("gemma3_text", True, "Gemma 3 (text)"),
    "phi3": Family("phi3", False, "Phi-3"),
    "olmo2": Family("olmo2", False, "OLMo 2"),
    "granite": Family("granite", False, "Granite"),
    "mixtral": Family("mixtral", False, "Mixtral"),
    "qwen3_moe": Family("qwen3_moe", False, "Qwen3-MoE"),
}


@dataclass(frozen=True)
class RolloutLayout:
    """How a case generates: the overrides that select it, and its column heading in the README."""

    overrides: tuple[str, ...]
    heading: str


MODES = {
    "hf": RolloutLayout(("rollout=hf",), "HF engine"),
    # OLMo-2: engine_process=auto runs it in processes of its own
    "vllm_tp1": RolloutLayout(("rollout=vllm_cpu",), "vLLM TP 1"),
    "vllm_tp2": RolloutLayout(("rollout=vllm_cpu", "rollout.tensor_model_parallel_size=2"), "vLLM TP 2"),
    "pool": RolloutLayout(("rollout=vllm_cpu", "rollout.n_gpus=1"), "vLLM pool"),
    "own_tp2": RolloutLayout(("rollout=vllm_cpu", "rollout.engine_process=own", "rollout.tensor_model_parallel_size=2"),
                             "vLLM TP 2, own processes"),
    # one actor rank (and one replica beside it)
    "vllm_1rank": RolloutLayout(("rollout=vllm_cpu", "trainer.n_gpus_per_node=1"), "vLLM, 1 actor rank"),
}
# Colocated replicas in processes of their own share the pool's code past the placement: a spread of the zoo
# (tied heads, fused projections, a head-less Gemma, both MoE layouts) checks that path.
OWN_PROCESS_ZOO = {"llama_tied", "qwen2", "gemma3", "phi3", "mixtral", "qwen3_moe"}
ONLY_FOR = {"own_tp2": OWN_PROCESS_ZOO, "vllm_1rank": {"olmo2"}}  # modes run for part of the zoo


def cases() -> Iterator[tuple[str, str]]:
    """(zoo name, mode) for every case of the grid."""
    for name in ZOO:
        for mode in MODES:
            if mode not in ONLY_FOR or name in ONLY_FOR[mode]:
                yield name, mode
