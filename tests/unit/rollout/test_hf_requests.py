"""The HF engine's request queue (``rollout/hf_requests.py``), which its ``generate`` and replica server run on:
requests decode in cohorts, one token per step; a request that arrives mid-cohort waits for the next and samples
what it samples alone; an abort ends one row and leaves the others' tokens as they were; a kept request continues
after ``resume`` under the new ``policy_version``; and a batch sampled through the server is one it can reproduce
request by request."""

from __future__ import annotations

import threading

import pytest
import torch

from hybridrl.modeling.single_rank import apply_compute_dtype
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.hf import HFRollout
from hybridrl.rollout.hf_decode import Forwards
from hybridrl.rollout.hf_requests import HFRequests
from hybridrl.rollout.server import ReplicaServer, serve
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model

VOCAB = 48
ENDINGS = [1, 5, 9, 13]  # rows end at spread-out steps


@pytest.fixture(scope="module")
def engine():
    """A bf16 tiny Llama (bf16 on CPU: a row's bits do not depend on the rows beside it) and its HF engine."""
    model = build_tiny_model(TinyModelSpec(architecture="llama"), VOCAB, pad_token_id=0, eos_token_id=1).eval()
    return HFRollout(apply_compute_dtype(model, torch.bfloat16), pad_token_id=0, eos_token_ids=ENDINGS)


@pytest.fixture(scope="module")
def long_engine(engine):
    """The same model, one EOS id in 48: rows run long."""
    return HFRollout(engine.model, pad_token_id=0, eos_token_ids=[1])


def queue_of(engine: HFRollout, version=lambda: 0, **options) -> HFRequests:
    return HFRequests(engine, Forwards(engine.model, fast=True), version=version, **options)


def prompt(seed: int, length: int = 6) -> list[int]:
    return torch.randint(14, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def alone(engine: HFRollout, ids: list[int], params: SamplingParams):
    """What ``ids`` samples as the only request of a queue."""
    queue = queue_of(engine)
    request_id = queue.submit(ids, params)
    [completion] = [c for c in queue.run() if c.request_id == request_id]
    return completion


def test_a_request_that_arrives_mid_cohort_waits_and_samples_what_it_samples_alone(engine):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)
    queue = queue_of(engine)
    first = queue.submit(prompt(1), params)
    queue.step()
    late = queue.submit(prompt(2), params.with_seed(5))
    first_token_step, finished_step, steps = {}, {}, 1
    while queue.has_work():
        steps += 1
        for completion in queue.step():
            first_token_step.setdefault(completion.request_id, steps)
            if completion.finished:
                finished_step[completion.request_id] = steps
    assert first_token_step[late] == finished_step[first] + 1  # at the first step after the first cohort ended
    late_alone = alone(engine, prompt(2), params.with_seed(5))
    assert set(finished_step) == {first, late}
    replay = queue_of(engine)
    replay.submit(prompt(1), params)
    replay.step()
    late_id = replay.submit(prompt(2), params.with_seed(5))
    done = {completion.request_id: completion for completion in replay.run()}
    assert (done[late_id].token_ids, done[late_id].log_probs) == (late_alone.token_ids, late_alone.log_probs)
    assert len(late_alone.token_ids) > 1


def test_an_abort_ends_one_row_and_leaves_the_others_as_they_were(long_engine):
    engine = long_engine
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=7)
    ids = [prompt(seed) for seed in range(4)]

    def run(abort_after: int | None):
        queue = queue_of(engine)
        request_ids = [queue.submit(row, params) for row in ids]
        for _ in range(abort_after or 0):
            queue.step()
        aborted = queue.abort(request_ids[1]) if abort_after else None
        finished = {c.request_id: c for c in queue.run()}
        if aborted is not None:
            finished[aborted.request_id] = aborted
        return [finished[request_id] for request_id in request_ids]

    whole, cut = run(None), run(3)
    assert len(whole[1].token_ids) > 3
    assert cut[1].finish_reason == "abort"
    assert cut[1].token_ids == whole[1].token_ids[:3]
    for row in (0, 2, 3):
        assert (cut[row].token_ids, cut[row].log_probs) == (whole[row].token_ids, whole[row].log_probs), row


def test_a_kept_request_continues_after_resume_under_the_new_version(engine):
    version = {"now": 0}
    params = SamplingParams(max_new_tokens=8, do_sample=False)
    seed = next(seed for seed in range(100) if len(alone(engine, prompt(seed), params).token_ids) >= 6)
    queue = queue_of(engine, version=lambda: version["now"])
    request_id = queue.submit(prompt(seed), params)
    queue.step(), queue.step(), queue.step()
    [parked] = queue.pause("keep")
    assert parked.finish_reason is None and len(parked.token_ids) == 3 and queue.paused == "keep"
    with pytest.raises(RuntimeError, match="paused"):
        queue.submit(prompt(seed + 1), params)
    version["now"] = 1
    assert queue.resume() == [request_id]
    [completion] = queue.run()
    reference = alone(engine, prompt(seed), params)
    assert completion.token_ids == reference.token_ids  # greedy: the prefix recomputed, the same tokens
    assert completion.policy_versions == [0] * 3 + [1] * (len(completion.token_ids) - 3)


def test_cohorts_share_a_prompts_prefill_and_hold_at_most_prompts_per_cohort(engine):
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=2)
    queue = queue_of(engine, samples_per_prompt=2, prompts_per_cohort=2)
    for index in range(3):
        for _ in range(2):
            queue.submit(prompt(index), params)
    engine.decode_rows_run = 0
    queue.step()
    assert engine.decode_rows_run == 4  # two prompts × two samples; the third prompt waits
    queue.run()
    alone_queue = queue_of(engine, samples_per_prompt=1)
    for _ in range(2):
        alone_queue.submit(prompt(0), params)
    engine.decode_rows_run = 0
    alone_queue.step()
    assert engine.decode_rows_run == 2  # without sharing each request is a prompt of its own: one cohort of two


def test_bad_requests_are_refused(engine):
    queue = queue_of(engine)
    with pytest.raises(ValueError, match="no tokens"):
        queue.submit([], SamplingParams())
    queue.submit(prompt(0), SamplingParams(max_new_tokens=4), request_id="a")
    with pytest.raises(ValueError, match="already in flight"):
        queue.submit(prompt(1), SamplingParams(), request_id="a")
    with pytest.raises(KeyError, match="not in flight"):
        queue.abort("b")
    with pytest.raises(ValueError, match="pause mode"):
        queue.pause("later")
    with pytest.raises(RuntimeError, match="without pause"):
        queue.resume()
    queue.run()
    assert queue.submit(prompt(1), SamplingParams(max_new_tokens=2), request_id="a") == "a"  # finished: free again
    with pytest.raises(ValueError, match="already in flight"):
        queue.submit(prompt(2), SamplingParams(), request_id="a")


def test_the_server_streams_one_token_per_step_and_generate_is_its_requests(engine):
    params = SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=4)
    ids = [prompt(20, 5), prompt(21, 7)]
    width = 7
    input_ids = torch.zeros((2, width), dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, row_ids in enumerate(ids):
        input_ids[row, width - len(row_ids):], mask[row, width - len(row_ids):] = torch.tensor(row_ids), 1
    batch = engine.generate(Batch(tensors={Fields.INPUT_IDS: input_ids, Fields.ATTENTION_MASK: mask}), params)

    async def stream_all(server: ReplicaServer):
        requests = [(row_ids, params, f"{row}-{sample}") for row, row_ids in enumerate(ids) for sample in range(2)]
        return await server.generate_many(requests)

    queue = queue_of(engine, prompt_width=width, samples_per_prompt=2)
    completions = serve(queue, stream_all)
    for row, completion in enumerate(completions):
        tokens = batch[Fields.RESPONSES][row][batch[Fields.RESPONSE_MASK][row].bool()].tolist()
        assert completion.token_ids == tokens, row
    one_by_one = queue_of(engine)

    async def deltas(server: ReplicaServer):
        return [delta async for delta in server.stream(ids[0], SamplingParams(max_new_tokens=5, do_sample=False))]
    pieces = serve(one_by_one, deltas)
    assert [len(delta.token_ids) for delta in pieces] == [1] * len(pieces) and pieces[-1].finish_reason


def test_a_batch_is_answered_whole_in_order_as_one_by_one_and_a_bad_request_refuses_it(engine):
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=9)
    requests = [(prompt(30 + index), params, f"b{index}") for index in range(5)]

    async def both(server: ReplicaServer):
        batch = await server.generate_batch(requests)
        with pytest.raises(ValueError, match="no tokens"):
            await server.generate_batch([(prompt(40), params, "ok"), ([], params, "empty")])
        assert server.health().in_flight == 0  # the refused batch left nothing queued
        return batch
    batch = serve(queue_of(engine), both)
    one_by_one = serve(queue_of(engine), lambda server: server.generate_many(requests))
    assert [c.request_id for c in batch] == [f"b{index}" for index in range(5)]
    assert [(c.token_ids, c.log_probs, c.finish_reason) for c in batch] == \
        [(c.token_ids, c.log_probs, c.finish_reason) for c in one_by_one]


def test_no_new_tokens_gives_empty_responses(engine):
    """``max_new_tokens=0``: the cohort ends without a decode step (it used to index column 0 of a 0-wide tensor)."""
    ids = prompt(50)
    batch = engine.generate(Batch(tensors={Fields.INPUT_IDS: torch.tensor([ids]),
                                           Fields.ATTENTION_MASK: torch.ones(1, len(ids), dtype=torch.long)}),
                            SamplingParams(n=2, max_new_tokens=0, do_sample=False))
    assert batch[Fields.RESPONSES].shape == (2, 0) and torch.equal(batch[Fields.PROMPTS], torch.tensor([ids, ids]))
    completions = serve(queue_of(engine), lambda server: server.generate_batch(
        [(ids, SamplingParams(max_new_tokens=0), "empty")]))
    assert [(c.token_ids, c.finish_reason) for c in completions] == [([], "length")]


def test_an_engine_failure_reaches_the_caller_as_itself(engine, monkeypatch):
    """A failing step (here an out-of-memory error from the model) is raised by ``serve`` with its own type and
    traceback, not only as the ``ReplicaClosed`` its waiting callers are given."""
    queue = queue_of(engine)

    def out_of_memory():
        raise torch.OutOfMemoryError("no memory left for the decode step")
    monkeypatch.setattr(queue, "step", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError, match="no memory left") as caught:
        serve(queue, lambda server: server.generate(prompt(51), SamplingParams(max_new_tokens=3)))
    assert any(entry.name == "out_of_memory" for entry in caught.traceback)


def test_an_interrupt_in_a_command_ends_serve_instead_of_hanging(engine):
    """Ctrl-C (or a termination signal) raised while a command runs on the engine loop — a weight update, the
    multi-rank tail of ``generate`` — is raised by ``serve``; its caller is answered, so nothing waits for ever."""
    def interrupted():
        raise KeyboardInterrupt
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            serve(queue_of(engine), lambda server: server.call(interrupted))
        except BaseException as error:  # noqa: BLE001 - what the test looks at
            outcome.append(error)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "serve() hung after an interrupt in a command"
    assert len(outcome) == 1 and isinstance(outcome[0], KeyboardInterrupt)
