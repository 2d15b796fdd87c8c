"""Request-level generation on an in-process vLLM engine: many requests in flight, streamed, aborted, paused.

What the replica server (``rollout/server.py``) drives from its engine thread: ``VLLMRollout.generate`` (a batch in,
a batch out) submits one request per response row in one command and the server steps the engine until none is
left; agent episodes submit their turns as they go. The queue itself, as the server uses it::

    requests = rollout.requests
    rid = requests.submit(prompt_token_ids, SamplingParams(max_new_tokens=64, seed=3))
    for progress in requests.stream(rid):       # one engine step at a time, other requests advance too
        ...                                     # progress.token_ids grows; progress.finished at the end
    requests.pause("keep")                      # before a weight update: in-flight requests are parked
    rollout.update_weights(stream, policy_version=4)  # later tokens record policy_version 4
    requests.resume()                           # parked requests continue under the new weights

Token ids in, token ids out: nothing is detokenised or re-tokenised. Every generated token carries the policy version
that produced it (``Completion.policy_versions``), so a trainer can tell a partial rollout's old-policy tokens from
its new ones.

Pause modes, for a weight update while requests are in flight:

- ``abort``: in-flight requests end now (``finish_reason="abort"``) with the tokens they have;
- ``wait``: the engine steps until every in-flight request has finished, then holds;
- ``keep``: in-flight requests are removed from the engine but kept here; :meth:`resume` resubmits each with its
  prompt followed by the tokens generated so far, so the rest is generated — its prefix's KV recomputed — under the
  weights loaded meanwhile. A seeded request continues from a seed derived from its own and the resubmission count.

Seeds: a request with ``seed`` samples from its own stream, independent of what else is in flight (vLLM's
per-request generator); ``generate`` gives row ``i·n + j`` the seed ``seed + i·n + j``, exactly vLLM's own fan-out of
``n`` samples, so results do not depend on how requests were batched.
"""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.completion import Completion, PausableRequests, PauseMode


class VLLMRequests(PausableRequests):
    """The request queue of one in-process vLLM engine (``llm.llm_engine``, vLLM's V1 ``LLMEngine``).

    Args:
        llm: the ``vllm.LLM``.
        vllm_sampling_params: ``(SamplingParams, streamed) -> vllm.SamplingParams`` for one response (``n = 1``),
            with the engine's stop ids, log-probs on, output ``DELTA`` (streamed) or ``FINAL_ONLY``.
        version: a zero-argument callable giving the ``policy_version`` of the weights the engine holds now.
    """

    def __init__(self, llm, vllm_sampling_params, version) -> None:
        self._engine = llm.llm_engine
        self._to_vllm = vllm_sampling_params
        self._version = version
        super().__init__()
        self._running: dict[str, Completion] = {}   # engine request id -> completion

    # --- submitting and stepping ---------------------------------------------------------------------------------

    def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams, request_id: Optional[str] = None,
               streamed: bool = True) -> str:
        """Queue one request (one response: ``params.n`` is ignored) and return its id; it starts at the next step.

        ``streamed=False``: the engine reports the request once, finished (cheaper per step; ``generate`` uses it,
        owning the engine for the call, so no pause can fall inside it). Its tokens then carry the version at the
        end, and an abort or a ``keep`` pause loses them — so pausing is refused while such a request runs.
        """
        completion = self._new_request(prompt_token_ids, params, request_id, streamed)
        self._add(completion)
        return completion.request_id

    def _add(self, completion: Completion) -> None:
        engine_id = f"{completion.request_id}#{completion.resubmissions}"
        prompt, params = completion.continuation()
        self._engine.add_request(engine_id, {"prompt_token_ids": prompt}, self._to_vllm(params, completion.streamed))
        self._running[engine_id] = completion

    @property
    def in_flight(self) -> list[str]:
        """Ids of the requests the engine is working on."""
        return [completion.request_id for completion in self._running.values()]

    def step(self) -> list[Completion]:
        """One engine step (continuous batching: every running request advances); the completions it touched."""
        if self._paused is not None:
            raise RuntimeError(f"the engine is paused ({self._paused!r}); resume() before stepping")
        touched = []
        version = self._version()
        for output in self._engine.step():
            completion = self._running.get(output.request_id)
            if completion is None:  # aborted meanwhile
                continue
            completion.cached_prompt_tokens = max(completion.cached_prompt_tokens, output.num_cached_tokens or 0)
            for piece in output.outputs:
                new_ids = list(piece.token_ids)
                completion.token_ids += new_ids
                completion.log_probs += [step[token].logprob for step, token in zip(piece.logprobs or [], new_ids)]
                completion.policy_versions += [version] * len(new_ids)
                if piece.finish_reason is not None:
                    completion.finish_reason = piece.finish_reason
            if output.finished:
                completion.finish_reason = completion.finish_reason or "stop"
                del self._running[output.request_id]
            touched.append(completion)
        return touched

    def has_work(self) -> bool:
        """Whether any request is in flight here or (data-parallel replicas) on a peer replica stepping with us."""
        return self._engine.has_unfinished_requests()

    def run(self) -> list[Completion]:
        """Step until nothing is in flight; the completions that finished, in the order they finished."""
        done = []
        while self.has_work():
            done += [completion for completion in self.step() if completion.finished]
        return done

    def stream(self, request_id: str) -> Iterator[Completion]:
        """Step until ``request_id`` finishes, yielding its completion after each step that advanced it."""
        target = next((c for c in self._running.values() if c.request_id == request_id), None)
        if target is None:
            raise KeyError(f"request {request_id!r} is not in flight")
        while not target.finished:
            if any(completion is target for completion in self.step()):
                yield target

    def abort(self, request_id: str) -> Completion:
        """End ``request_id`` now; its completion keeps the tokens generated so far (``finish_reason="abort"``)."""
        for engine_id, completion in list(self._running.items()):
            if completion.request_id == request_id:
                self._engine.abort_request([engine_id])
                del self._running[engine_id]
                completion.finish_reason = "abort"
                return completion
        raise KeyError(f"request {request_id!r} is not in flight")

    # --- pause and resume ---------------------------------------------------------------------------------------

    def _pause_refused(self, mode: PauseMode) -> Optional[str]:
        if mode != "wait" and not all(completion.streamed for completion in self._running.values()):
            return (f"pause({mode!r}) with unstreamed requests in flight (submit(streamed=False)): their tokens so "
                    "far are not known here; pause('wait') or let them finish")
        return None

    def _requeue(self, completion: Completion) -> None:
        self._add(completion)
