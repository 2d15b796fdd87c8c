"""What the gateway does for a request, apart from HTTP: build the prompt ids (continuing a session's ids where the
conversation continues one, ``sessions.py``), sample every choice on the replica server, answer in OpenAI's shapes
(``replies.py``), and record each call of a session token for token.

A request without a session is served the same way and recorded nowhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Optional, Sequence

from hybridrl.agents.tools import TOOL_CALL_OPEN
from hybridrl.agents.trajectory import ChatRenderer
from hybridrl.gateway.openai_schema import ChatCompletionRequest, CompletionRequest, GatewayError
from hybridrl.gateway.replies import (Sampled, chat_logprobs, completion_logprobs, cut_at_stop, for_template,
                                      reply_message, streamable)
from hybridrl.gateway.sessions import Call, SessionRecord
from hybridrl.rollout.base import SamplingParams
from hybridrl.utils.seeding import derive_seed


@dataclass
class GatewayBackend:
    """What the gateway serves from: a replica ``server`` (``rollout/server.py``), the policy's ``tokenizer`` (its
    chat template), the engine's ``stop_ids``, its context length ``max_model_len``, the ``model_name`` reported,
    and ``max_tokens``: the most new tokens one request may ask for."""

    server: Any
    tokenizer: Any
    stop_ids: Sequence[int]
    max_model_len: int
    model_name: str = "hybridrl"
    max_tokens: int = 4096
    training: Optional["TrainingLimits"] = None
    """Set when a trainer learns from the sessions: how it samples and how long an episode may be."""


@dataclass(frozen=True)
class TrainingLimits:
    """What a trainer's gateway holds every request to. ``sampling``: the rollout's settings — every choice is
    sampled with its temperature, top-p and top-k whatever the request asks (the trainer's log-probs assume them),
    seeded from its ``seed``, the session, the prompt ids and how often the session asked them before;
    ``max_prompt_tokens``: the most ids a sequence's first prompt may have (``data.max_prompt_length``);
    ``max_response_tokens``: the most ids after it, the model's and the tools' together
    (``data.max_response_length``)."""

    sampling: SamplingParams
    max_prompt_tokens: int
    max_response_tokens: int


@dataclass
class Prompt:
    """A request's prompt ids; ``parent``: the call it continues (its index in the session) with the ids after that
    call's end (``observation_ids``); ``rendered``: the conversation as the template saw it."""

    ids: list[int]
    parent: Optional[int] = None
    observation_ids: list[int] = field(default_factory=list)
    rendered: list[dict] = field(default_factory=list)
    template_matched: bool = True
    root_length: Optional[int] = None
    """The length of the prompt its sequence began with (default: this prompt's own, when it starts one)."""

    def __post_init__(self) -> None:
        if self.root_length is None:
            self.root_length = len(self.ids)

    @property
    def response_length(self) -> int:
        """Ids after the sequence's first prompt: what the trainer counts as response."""
        return len(self.ids) - self.root_length


class GatewayService:
    """Serves chat and completion requests from ``backend``; keeps the sessions' records until taken
    (``record_sessions=False``: none are kept, for a gateway nobody trains from)."""

    def __init__(self, backend: GatewayBackend, record_sessions: bool = True,
                 only_its_model_name: bool = False) -> None:
        self.backend, self.record_sessions = backend, record_sessions
        self.only_its_model_name = only_its_model_name
        """Refuse (404) a request naming another model, as OpenAI and vLLM do (``hybridrl serve``); a trainer's
        gateway answers whatever name the agent code sends."""
        self._plain_renderer = ChatRenderer(backend.tokenizer)
        self._sessions: dict[str, SessionRecord] = {}
        self._lock = threading.Lock()

    # --- sessions ------------------------------------------------------------------------------------------------

    def session(self, session_id: Optional[str]) -> Optional[SessionRecord]:
        """The record of ``session_id`` (made on first use); ``None`` for no session."""
        if not session_id or not self.record_sessions:
            return None
        with self._lock:
            return self._sessions.setdefault(session_id, SessionRecord(session_id))

    def take_session(self, session_id: str) -> SessionRecord:
        """The record of ``session_id``, removed from the gateway (an empty one if it made no call)."""
        with self._lock:
            return self._sessions.pop(session_id, None) or SessionRecord(session_id)

    # --- chat ----------------------------------------------------------------------------------------------------

    def check_model_name(self, name: str) -> None:
        """``GatewayError`` 404 when ``name`` is not the served model's (and this gateway says so); empty is fine."""
        if self.only_its_model_name and name and name != self.backend.model_name:
            raise GatewayError(404, f"The model `{name}` does not exist; this server serves "
                                    f"`{self.backend.model_name}` (GET /v1/models)", param="model",
                               code="model_not_found")

    async def chat(self, request: ChatCompletionRequest, session_id: Optional[str] = None) -> dict[str, Any]:
        """A ``chat.completion`` for ``request`` (every choice sampled to its end)."""
        session, messages, tools = self.session(session_id), [m.plain() for m in request.messages], request.tools
        prompt = self._chat_prompt(messages, tools, session)
        finals = await asyncio.gather(*(_last(self._sample(prompt.ids, params, request.stop_strings()))
                                        for params in self._choices(request, prompt, session)))
        choices = []
        for index, sampled in enumerate(finals):
            reply, calls_tools = reply_message(sampled.text, with_tools=self._tools_on(request))
            self._record(session, messages, tools, prompt, sampled, reply)
            choices.append({"index": index, "message": reply, "token_ids": sampled.token_ids,
                            "finish_reason": "tool_calls" if calls_tools else sampled.finish_reason,
                            "logprobs": chat_logprobs(self.backend.tokenizer, sampled) if request.logprobs else None})
        return {**self._head("chat.completion"), "choices": choices, "prompt_token_ids": prompt.ids,
                "usage": _usage(prompt.ids, finals)}

    def chat_chunks(self, request: ChatCompletionRequest,
                    session_id: Optional[str] = None) -> AsyncIterator[dict[str, Any]]:
        """The ``chat.completion.chunk`` s of a streamed request, the choices' chunks interleaved as they come. A
        request the gateway refuses raises :class:`GatewayError` here, before any chunk (so before any response
        header: the client gets the 4xx, not an error inside a 200 stream)."""
        session, messages, tools = self.session(session_id), [m.plain() for m in request.messages], request.tools
        prompt = self._chat_prompt(messages, tools, session)
        return self._chunks(request, session, messages, tools, prompt, self._choices(request, prompt, session))

    async def _chunks(self, request: ChatCompletionRequest, session: Optional[SessionRecord], messages: list[dict],
                      tools: Optional[list[dict]], prompt: Prompt,
                      choices: list[SamplingParams]) -> AsyncIterator[dict[str, Any]]:
        head = self._head("chat.completion.chunk")
        holds = [*request.stop_strings(), *([TOOL_CALL_OPEN] if self._tools_on(request) else [])]

        async def one_choice(index: int, params: SamplingParams) -> AsyncIterator[dict]:
            yield _chunk(head, index, {"role": "assistant", "content": ""})
            sent_text, sent_tokens = "", 0
            sampled, reply, calls_tools = Sampled(), {"role": "assistant", "content": ""}, False
            async for sampled in self._sample(prompt.ids, params, request.stop_strings(), streamed=True):
                text = sampled.text if sampled.finish_reason else streamable(sampled.text, holds)
                if sampled.finish_reason:
                    reply, calls_tools = reply_message(sampled.text, with_tools=self._tools_on(request))
                    text = reply.get("content") or ""
                new_text = text[len(sent_text):] if text.startswith(sent_text) else ""
                logprobs = None
                if request.logprobs and len(sampled.token_ids) > sent_tokens:
                    logprobs = chat_logprobs(self.backend.tokenizer, Sampled(
                        sampled.token_ids[sent_tokens:], sampled.log_probs[sent_tokens:]))
                    sent_tokens = len(sampled.token_ids)
                if new_text or logprobs:
                    yield _chunk(head, index, {"content": new_text}, logprobs=logprobs)
                    sent_text += new_text
            self._record(session, messages, tools, prompt, sampled, reply)
            if calls_tools:
                yield _chunk(head, index, {"tool_calls": [{"index": k, **call}
                                                          for k, call in enumerate(reply["tool_calls"])]})
            yield _chunk(head, index, {}, finish_reason="tool_calls" if calls_tools else sampled.finish_reason)

        async for chunk in _merged([one_choice(index, params) for index, params in enumerate(choices)]):
            yield chunk

    def _chat_prompt(self, messages: list[dict], tools: Optional[list[dict]],
                     session: Optional[SessionRecord]) -> Prompt:
        renderer = ChatRenderer(self.backend.tokenizer, tools or ())
        found = session.find_parent(messages, _tools_key(tools)) if session is not None else None
        if found is not None:
            parent, index, new_messages = found
            history = [*parent.rendered, {"role": "assistant", "content": parent.raw_text}]
            new_rendered = for_template(new_messages)
            observation, matched = renderer.observation_ids(history, new_rendered, parent.ids)
            prompt = Prompt(parent.ids + observation, index, observation, [*history, *new_rendered], matched,
                            root_length=parent.root_prompt_length)
        else:
            rendered = for_template(messages)
            try:
                prompt = Prompt(renderer.prompt_ids(rendered), rendered=rendered)
            except Exception as error:  # noqa: BLE001 - the template's refusal, told to the client
                raise GatewayError(400, f"messages: the chat template cannot render them: "
                                        f"{type(error).__name__}: {error}", param="messages") from error
        self._check_prompt(prompt)
        return prompt

    def _tools_on(self, request: ChatCompletionRequest) -> bool:
        return bool(request.tools) and request.tool_choice != "none"

    def _record(self, session: Optional[SessionRecord], messages: list[dict], tools: Optional[list[dict]],
                prompt: Prompt, sampled: Sampled, reply: dict) -> None:
        if session is None or self._spent(prompt):  # nothing was generated
            return
        session.add(Call(messages=messages, reply=reply, prompt_ids=list(prompt.ids),
                         completion_ids=list(sampled.token_ids), log_probs=list(sampled.log_probs),
                         policy_versions=list(sampled.policy_versions), finish_reason=str(sampled.finish_reason),
                         parent=prompt.parent, observation_ids=list(prompt.observation_ids),
                         rendered=prompt.rendered, raw_text=self._decode(sampled.token_ids),
                         tools_key=_tools_key(tools),
                         root_prompt_length=prompt.root_length),
                    template_matched=prompt.template_matched)

    # --- completions ---------------------------------------------------------------------------------------------

    async def complete(self, request: CompletionRequest, session_id: Optional[str] = None) -> dict[str, Any]:
        """A ``text_completion`` for ``request``: a text prompt is tokenised as the tokenizer does by default, a
        list of ids is used as given; in a session, a prompt that extends an earlier call's ids continues it."""
        session = self.session(session_id)
        prompt = self._completion_prompt(request, session)
        finals = await asyncio.gather(*(_last(self._sample(prompt.ids, params, request.stop_strings()))
                                        for params in self._choices(request, prompt, session)))
        choices = []
        for index, sampled in enumerate(finals):
            self._record(session, [], None, prompt, sampled, {"role": "assistant", "content": sampled.text})
            choices.append({"index": index, "text": sampled.text, "token_ids": sampled.token_ids,
                            "finish_reason": sampled.finish_reason,
                            "logprobs": (completion_logprobs(self.backend.tokenizer, sampled)
                                         if request.logprobs is not None else None)})
        return {**self._head("text_completion"), "choices": choices, "prompt_token_ids": prompt.ids,
                "usage": _usage(prompt.ids, finals)}

    def _completion_prompt(self, request: CompletionRequest, session: Optional[SessionRecord]) -> Prompt:
        if isinstance(request.prompt, str):
            ids = list(self.backend.tokenizer(request.prompt)["input_ids"])
        else:
            vocabulary = len(self.backend.tokenizer)
            bad = [token for token in request.prompt if not 0 <= token < vocabulary]
            if bad:
                raise GatewayError(400, f"prompt: token id {bad[0]} is outside the vocabulary (0..{vocabulary - 1})",
                                   param="prompt")
            ids = list(request.prompt)
        found = session.find_prefix_call(ids) if session is not None else None
        prompt = Prompt(ids)
        if found is not None:
            parent, index = found
            prompt = Prompt(ids, index, ids[len(parent.ids):], root_length=parent.root_prompt_length)
        self._check_prompt(prompt)
        return prompt

    # --- sampling ------------------------------------------------------------------------------------------------

    def _spent(self, prompt: Prompt) -> bool:
        """Whether ``prompt``'s episode has used all the response tokens a trainer allows: every choice is then
        answered empty, with ``finish_reason`` ``length``, without sampling, and the call is not recorded."""
        training = self.backend.training
        return training is not None and prompt.response_length >= training.max_response_tokens

    def _check_prompt(self, prompt: Prompt) -> None:
        """Refuse a prompt with no room to generate and, for a trainer, a sequence's first prompt over
        ``max_prompt_tokens`` (a spent episode's prompt is answered empty instead: :meth:`_spent`)."""
        training = self.backend.training
        if self._spent(prompt):
            return
        if len(prompt.ids) >= self.backend.max_model_len:
            raise GatewayError(400, f"the prompt is {len(prompt.ids)} tokens; the model's context is "
                                    f"{self.backend.max_model_len}, leaving no room to generate",
                               param="messages", code="context_length_exceeded")
        if training is not None and prompt.parent is None and len(prompt.ids) > training.max_prompt_tokens:
            raise GatewayError(400, f"the prompt is {len(prompt.ids)} tokens and starts a training sequence (it is "
                                    "the episode's first, or its messages are not an earlier request's plus the "
                                    "reply given to it plus new ones), which may be at most "
                                    f"{training.max_prompt_tokens} (data.max_prompt_length)",
                               param="messages", code="context_length_exceeded")

    def _choices(self, request, prompt: Prompt, session: Optional[SessionRecord]) -> list[SamplingParams]:
        """One sampling per choice: the request's, or a trainer's (``TrainingLimits``) with the request's length."""
        room = self.backend.max_model_len - len(prompt.ids)
        asked = request.token_limit()
        training = self.backend.training
        if asked is not None and asked > self.backend.max_tokens and training is None:
            raise GatewayError(400, f"max_tokens: {asked} is over the gateway's limit of {self.backend.max_tokens}",
                               param="max_tokens")
        limit = min(asked or self.backend.max_tokens, self.backend.max_tokens, room)
        if training is None:
            params = SamplingParams(max_new_tokens=limit, do_sample=request.temperature > 0,
                                    temperature=request.temperature or 1.0, top_p=request.top_p, seed=request.seed)
            return [params if request.seed is None else replace(params, seed=request.seed + index)
                    for index in range(request.n)]
        # a trainer's gateway: its sampling, the episode's budget (what an agent asks beyond it is cut, not refused)
        limit = 0 if self._spent(prompt) else min(limit, training.max_response_tokens - prompt.response_length)
        base, seeds = training.sampling, [None] * request.n
        if base.seed is not None:
            # seeded by what is asked (the prompt ids) and how often the session asked it before, never by the
            # order requests arrive in: concurrent calls of a session get the same seeds in every run
            session_id, asked_before = (session.session_id, session.claim(prompt.ids)) if session else ("", 0)
            digest = hashlib.sha256(str(prompt.ids).encode()).hexdigest()[:16]
            seeds = [derive_seed(base.seed, session_id, digest, asked_before, index) for index in range(request.n)]
        return [replace(base, n=1, max_new_tokens=limit, seed=seed) for seed in seeds]

    async def _sample(self, prompt_ids: list[int], params: SamplingParams, stops: Sequence[str],
                      streamed: bool = False) -> AsyncIterator[Sampled]:
        """The choice as it grows, one state per engine step (``streamed``, or with stop strings to watch for;
        otherwise once, finished); the last has ``finish_reason``. A stop string ends it (the text is cut before
        it; the ids keep every token sampled, up to the one that completed it)."""
        sampled = Sampled()
        if params.max_new_tokens <= 0:  # an episode whose response budget is spent (_spent)
            sampled.finish_reason = "length"
            yield sampled
            return
        if not stops and not streamed:  # the engine reports it once, at its end: no per-token traffic
            completion = await self.backend.server.generate(prompt_ids, params, streamed=False)
            sampled.token_ids, sampled.log_probs = completion.token_ids, completion.log_probs
            sampled.policy_versions, sampled.text = completion.policy_versions, self._decode(completion.token_ids)
            sampled.finish_reason = _finish_reason(completion.finish_reason)
            yield sampled
            return
        async with contextlib.aclosing(self.backend.server.stream(prompt_ids, params)) as deltas:
            async for delta in deltas:
                sampled.token_ids += delta.token_ids
                sampled.log_probs += delta.log_probs
                sampled.policy_versions += delta.policy_versions
                sampled.text = self._decode(sampled.token_ids)
                cut = cut_at_stop(sampled.text, stops) if stops else None
                if cut is not None:
                    sampled.text, sampled.finish_reason = cut, "stop"
                    yield sampled
                    return  # leaving the stream aborts the request
                if delta.finish_reason is not None:
                    sampled.finish_reason = _finish_reason(delta.finish_reason)
                yield sampled

    def _decode(self, token_ids: Sequence[int]) -> str:
        """The text of sampled ids, a final stop token left out — as the agent loop decodes a model turn."""
        return self._plain_renderer.decode(token_ids, self.backend.stop_ids)

    def _head(self, kind: str) -> dict[str, Any]:
        prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
        return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
                "model": self.backend.model_name}


def _finish_reason(engine_reason: Optional[str]) -> str:
    """OpenAI's finish reason for the engine's (``stop`` / ``length`` / ``abort``)."""
    return {"length": "length", "abort": "abort"}.get(str(engine_reason), "stop")


def _tools_key(tools: Optional[list[dict]]) -> str:
    return json.dumps(tools or [], sort_keys=True)


def _usage(prompt_ids: Sequence[int], finals: Sequence[Sampled]) -> dict[str, int]:
    completion = sum(len(sampled.token_ids) for sampled in finals)
    return {"prompt_tokens": len(prompt_ids), "completion_tokens": completion,
            "total_tokens": len(prompt_ids) + completion}


def _chunk(head: dict, index: int, delta: dict, finish_reason: Optional[str] = None,
           logprobs: Optional[dict] = None) -> dict[str, Any]:
    return {**head, "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason,
                                 "logprobs": logprobs}]}


async def _last(states: AsyncIterator[Sampled]) -> Sampled:
    last = Sampled()
    async for last in states:
        pass
    return last


async def _merged(streams: list[AsyncIterator[dict]]) -> AsyncIterator[dict]:
    """The items of ``streams`` as each produces them (one stream: in order); an error in one is raised here."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(stream: AsyncIterator[dict]) -> None:
        try:
            async for item in stream:
                await queue.put(item)
        except BaseException as error:  # noqa: BLE001 - handed to the consumer
            await queue.put(error)
        finally:
            await queue.put(done)
    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
