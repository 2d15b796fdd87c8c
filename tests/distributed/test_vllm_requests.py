"""The request-level API of the in-process vLLM engine (real vLLM CPU build, tiny fp32 model): submit, stream, abort,
many in flight, pause (abort / wait / keep) around a weight update with each token's weight version — checked against
``generate`` and plain transformers greedy decoding."""

from __future__ import annotations

import copy

import pytest
import torch
from vllm_helpers import engine, hf_model, model_dir, tokenizer  # noqa: F401 (fixtures)

from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.utils.tiny_model import encode_chat

pytest.importorskip("vllm", reason="needs vLLM (pip install 'hybridrl[cpu]')")
pytestmark = pytest.mark.distributed

PROMPTS = ["12+34=", "what is 7*8?", "hello there", "x", "a longer prompt than the others", "99-9="]
MAX_NEW_TOKENS = 10
GREEDY = SamplingParams(max_new_tokens=MAX_NEW_TOKENS, do_sample=False)


@pytest.fixture
def requests(engine):
    yield engine.requests
    if engine.requests.paused:
        engine.requests.resume()
    for request_id in engine.requests.in_flight:
        engine.requests.abort(request_id)


def prompt_ids(tokenizer) -> list[list[int]]:
    return encode_chat(tokenizer, PROMPTS)


def transformers_greedy(model, tokenizer, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Plain ``generate`` of one prompt, cut after the first EOS (kept), as the engine reports it."""
    output = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                            max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id)[0, len(prompt):].tolist()
    return output[:output.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in output else output


def as_batch(tokenizer, prompts: list[list[int]]) -> Batch:
    encoded = tokenizer.pad({"input_ids": prompts}, return_tensors="pt")
    return Batch(tensors={Fields.INPUT_IDS: encoded["input_ids"], Fields.ATTENTION_MASK: encoded["attention_mask"]},
                 non_tensors={Fields.UID: [f"p{i}" for i in range(len(prompts))]})


def test_many_in_flight_advance_together_and_equal_generate(requests, engine, tokenizer):
    """All requests advance in one engine step (continuous batching), and each equals the batch call's row with the
    same seed — ``generate`` is a wrapper over these requests."""
    params = SamplingParams(max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, seed=5)
    ids = [requests.submit(prompt, params.with_seed(5 + index), request_id=f"q{index}")
           for index, prompt in enumerate(prompt_ids(tokenizer))]
    assert requests.in_flight == ids
    first_step = requests.step()
    assert {completion.request_id for completion in first_step} == set(ids)  # every request got a token at once
    done = {completion.request_id: completion for completion in first_step + requests.run() if completion.finished}
    batch = engine.generate(as_batch(tokenizer, prompt_ids(tokenizer)), params.with_seed(5))
    for index, request_id in enumerate(ids):
        completion, length = done[request_id], int(batch[Fields.RESPONSE_MASK][index].sum())
        assert completion.token_ids[:length] == batch[Fields.RESPONSES][index, :length].tolist()
        assert torch.allclose(torch.tensor(completion.log_probs[:length]),
                              batch[Fields.ROLLOUT_LOG_PROBS][index, :length])
    assert requests.in_flight == []


def test_stream_yields_growing_tokens_and_ends_as_greedy_transformers(requests, engine, tokenizer, hf_model):
    prompt = prompt_ids(tokenizer)[1]
    request_id = requests.submit(prompt, GREEDY)
    lengths, last = [], None
    for progress in requests.stream(request_id):
        lengths.append(len(progress.token_ids))
        last = progress
    assert lengths == sorted(lengths) and lengths[0] >= 1 and last.finished
    assert last.token_ids == transformers_greedy(hf_model, tokenizer, prompt, MAX_NEW_TOKENS)
    assert last.policy_versions == [engine.policy_version] * len(last.token_ids)


def test_abort_keeps_the_tokens_so_far_and_the_others_finish(requests, tokenizer):
    prompts = prompt_ids(tokenizer)[:3]
    for index, prompt in enumerate(prompts):
        requests.submit(prompt, GREEDY, request_id=f"a{index}")
    requests.step()
    requests.step()
    aborted = requests.abort("a1")
    assert aborted.finish_reason == "abort" and 1 <= len(aborted.token_ids) < MAX_NEW_TOKENS
    assert requests.in_flight == ["a0", "a2"]
    finished = requests.run()
    assert sorted(completion.request_id for completion in finished) == ["a0", "a2"]
    with pytest.raises(KeyError, match="not in flight"):
        requests.abort("a1")


def test_pause_keep_resumes_under_new_weights_with_token_versions(requests, engine, tokenizer, hf_model):
    """Tokens before the update come from version v, after it from v + 1; the continuation is exactly greedy
    decoding of the new model from the prompt plus the tokens generated before the pause."""
    updated = copy.deepcopy(hf_model)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in updated.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    prompt = prompt_ids(tokenizer)[4]
    params = SamplingParams(max_new_tokens=40, do_sample=False)
    request_id = requests.submit(prompt, params)
    for _ in range(3):
        requests.step()
    version = engine.policy_version
    try:
        with pytest.raises(RuntimeError, match="request\\(s\\) in flight: pause the requests first"):
            engine.update_weights(updated.named_parameters())
        parked = requests.pause("keep")
        before = list(parked[0].token_ids)
        assert [c.request_id for c in parked] == [request_id] and len(before) == 3 and requests.in_flight == []
        with pytest.raises(RuntimeError, match="paused"):
            requests.submit(prompt, params)
        engine.update_weights(updated.named_parameters())
        assert requests.resume() == [request_id]
        completion = requests.run()[0]
        assert completion.token_ids[:3] == before
        assert completion.policy_versions == [version] * 3 + [version + 1] * (len(completion.token_ids) - 3)
        continuation = transformers_greedy(updated, tokenizer, prompt + before, 40 - 3)
        assert completion.token_ids[3:] == continuation
    finally:
        if requests.paused:
            requests.resume()
        engine.update_weights(hf_model.named_parameters())


def test_pause_abort_and_wait(requests, tokenizer):
    prompts = prompt_ids(tokenizer)[:2]
    for index, prompt in enumerate(prompts):
        requests.submit(prompt, GREEDY, request_id=f"w{index}")
    requests.step()
    ended = requests.pause("abort")
    assert [c.finish_reason for c in ended] == ["abort", "abort"] and requests.in_flight == []
    requests.resume()
    for index, prompt in enumerate(prompts):
        requests.submit(prompt, GREEDY, request_id=f"v{index}")
    finished = requests.pause("wait")
    assert sorted(c.request_id for c in finished) == ["v0", "v1"] and all(c.finished for c in finished)
    assert all(c.finish_reason in ("stop", "length") for c in finished)
    with pytest.raises(RuntimeError, match="resume\\(\\) before stepping"):
        requests.step()
    requests.resume()
    with pytest.raises(ValueError, match="pause mode must be one of"):
        requests.pause("later")


def test_generate_refuses_while_requests_are_in_flight(requests, engine, tokenizer):
    requests.submit(prompt_ids(tokenizer)[0], GREEDY, request_id="busy")
    with pytest.raises(RuntimeError, match="needs the engine to itself"):
        engine.generate(as_batch(tokenizer, prompt_ids(tokenizer)[:1]), GREEDY)
    requests.abort("busy")
