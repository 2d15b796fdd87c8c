"""Helpers of the vLLM engine tests (a plain module: ``conftest`` names collide across test folders)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridrl.config.schema import RolloutConfig
from hybridrl.rollout import EngineInputs, build_rollout_engine
from hybridrl.utils.tiny_model import save_tiny_model


def cpu_engine(model_dir, tokenizer, max_model_len: int = 200):
    """An in-process fp32 vLLM engine (CPU build) on ``model_dir``: up to 32 sequences, the KV cache left unset (sized
    for them by ``rollout.kv_budget``)."""
    rollout = RolloutConfig(name="vllm", max_num_seqs=32, max_num_batched_tokens=1024)
    return build_rollout_engine("vllm", EngineInputs(
        rollout=rollout, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id],
        model_path=str(model_dir), max_model_len=max_model_len, dtype="float32"))


# Module-scoped fixtures of a tiny fp32 model and its engine; a test module imports the ones it uses.
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("vllm_model") / "model")


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(model_dir, tokenizer):
    engine = cpu_engine(model_dir, tokenizer)
    yield engine
    engine.close()


class RecordingRequests:
    """An engine's request queue, passed through; keeps every finished completion (``finished``, in order, and
    ``finished_by_id``), the sampling each request was given (``params``) and its prompt ids (``prompts_by_id``) —
    what tests compare trained rows with."""

    def __init__(self, requests) -> None:
        self.requests, self.finished, self.finished_by_id, self.params = requests, [], {}, []
        self.prompts_by_id: dict[str, list[int]] = {}

    def __getattr__(self, name):  # has_work, abort, pause, resume, in_flight, paused …
        return getattr(self.requests, name)

    def submit(self, prompt_ids, params, *args, **kwargs):
        self.params.append(params)
        request_id = self.requests.submit(prompt_ids, params, *args, **kwargs)
        self.prompts_by_id[request_id] = list(prompt_ids)
        return request_id

    def step(self):
        completions = self.requests.step()
        for completion in completions:
            if completion.finished:
                self.finished.append(completion)
                self.finished_by_id[completion.request_id] = completion
        return completions
