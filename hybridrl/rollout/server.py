"""A replica as a server: many callers, one engine loop, token ids in and out (docs/architecture.md §6).

``ReplicaServer`` puts a request queue (``VLLMRequests``, a tensor-parallel leader's ``LeaderRequests``, the HF
engine's ``HFRequests``) behind an asynchronous, thread-safe interface. One thread owns the engine (a thread of the
server's own, or with :func:`serve` the thread that calls it): it takes the callers' commands between engine steps —
submit, abort, pause, resume, or any function to run on the engine (a weight update, sleep / wake) — and steps while
anything is in flight, handing each request's new tokens to its caller as they come. Callers are coroutines on any
event loop, in any thread (an HTTP handler, an agent's episode, a batch generation)::

    server = ReplicaServer(rollout.requests, version=lambda: rollout.policy_version)
    completion = await server.generate(prompt_ids, SamplingParams(max_new_tokens=64, seed=3))
    rows = await server.generate_many([(ids, params, f"row-{i}") for i, ids in enumerate(prompts)])  # one command
    async for delta in server.stream(prompt_ids, params):    # the tokens of each engine step, as they come
        ...
    await server.pause("keep"); await server.call(rollout.update_weights, weights, 4); await server.resume()

Every token carries the ``policy_version`` of the weights that produced it (``Completion.policy_versions``); a
request runs once however many callers wait on the server. Nothing touches the engine outside its thread, so a
caller cannot interleave with a step. ``generate_many`` submits its requests in one command, so all of them enter
the engine before the same step whatever the callers' timing: a batch generates exactly as the request queue
stepped to the end would. :func:`serve` runs one piece of work on a server for the length of a call (what
``VLLMRollout.generate``, ``HFRollout.generate`` and the agent loop do).
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent import futures
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Sequence, TypeVar

import torch

from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.completion import Completion, PauseMode
from hybridrl.utils.process_threads import kept_for_the_process

logger = logging.getLogger(__name__)

T = TypeVar("T")
_CALLERS = futures.ThreadPoolExecutor(max_workers=1024, thread_name_prefix=kept_for_the_process("replica-caller"))
"""The threads :func:`serve` runs its callers' event loops on, kept between calls (a thread start per call costs
the engine's thread a switch) and for the process's life (a reused worker process keeps them). Idle ones are
reused; the bound is only there to be one: every concurrent ``serve`` holds one, and one that had to wait for
another's would wait for ever."""
Request = tuple[Sequence[int], SamplingParams, Optional[str]]
"""One request to submit: prompt ids, sampling parameters (one response), its id (``None``: the queue names it)."""


@dataclass(frozen=True)
class Delta:
    """What one engine step added to a request: ``token_ids`` with their ``log_probs`` (nats, at the request's
    temperature) and ``policy_versions``; ``finish_reason`` once it ended (``stop`` / ``length`` / ``abort``)."""

    request_id: str
    token_ids: list[int]
    log_probs: list[float]
    policy_versions: list[int]
    finish_reason: Optional[str] = None


@dataclass(frozen=True)
class ReplicaHealth:
    """A replica's state as its server sees it: ``alive`` until closed or its engine thread failed (``error``)."""

    alive: bool
    in_flight: int
    paused: Optional[str]
    policy_version: Optional[int]
    engine_steps: int
    seconds_since_step: Optional[float]
    error: Optional[str] = None


class ReplicaClosed(RuntimeError):
    """The replica's server was closed, or its engine thread failed (the reason is the message)."""


@dataclass
class _Waiter:
    """One request's channel back to its caller: deltas are put on ``queue`` in the caller's event loop."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    completion: Completion  # what the caller assembles from the deltas
    sent: int = 0  # tokens of the engine's completion already handed over

    def put(self, item: Any) -> None:
        _post(self.loop, self.queue.put_nowait, item)


@dataclass
class _Batch:
    """Requests answered together (:meth:`ReplicaServer.generate_batch`): ``completions`` in order, filled as
    they finish; ``future`` is settled in the caller's ``loop`` when ``remaining`` reaches 0."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    completions: list[Optional[Completion]]
    remaining: int


@dataclass
class _Command:
    """A function to run on the engine thread, and where its result goes."""

    run: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


class ReplicaServer:
    """The asynchronous request interface of one replica (see the module docstring).

    Args:
        requests: the replica's request queue (``submit`` / ``step`` / ``has_work`` / ``abort`` / ``pause`` /
            ``resume``; ``VLLMRequests``), used from the server's engine thread only from now on.
        version: the ``policy_version`` of the weights the engine holds (for :meth:`health`).
        name: the engine thread's name (logs).
        after_step: called with ``requests`` on the engine thread after every engine step; it may ``pause("keep")``,
            update the weights and ``resume()`` (partial rollout takes newer weights so).
        own_thread: start a thread of its own for the engine; ``False``: the engine runs in the thread that calls
            :meth:`run_here` (what :func:`serve` does with its caller's thread).
    """

    def __init__(self, requests, version: Callable[[], Optional[int]] = lambda: None,
                 name: str = "replica", after_step: Optional[Callable[[Any], None]] = None,
                 own_thread: bool = True) -> None:
        self._requests, self._version, self._after_step = requests, version, after_step
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._waiters: dict[str, _Waiter] = {}
        self._batched: dict[str, tuple[_Batch, int]] = {}  # request id -> its batch and place in it
        self._engine_steps, self._last_step = 0, None
        self._error: Optional[BaseException] = None
        self._closed = False
        # vLLM's CPU kernels check that a step runs with the thread count its engine was built with; OpenMP's count
        # is per thread, so the engine thread takes its creator's
        self._torch_threads = torch.get_num_threads()
        self._cuda_device = torch.cuda.current_device() if torch.cuda.is_initialized() else None
        self._thread: Optional[threading.Thread] = None
        if own_thread:
            self._thread = threading.Thread(target=self._serve, name=f"{name}-engine", daemon=True)
            self._thread.start()

    # --- the callers' side ----------------------------------------------------------------------------------------

    async def stream(self, prompt_token_ids: Sequence[int], params: SamplingParams,
                     request_id: Optional[str] = None) -> AsyncIterator[Delta]:
        """Submit one request and yield what each engine step adds to it, the last delta with its
        ``finish_reason``. Leaving the iteration early aborts the request."""
        [(request_id, waiter)] = await self._open([(prompt_token_ids, params, request_id)], streamed=True)
        async with contextlib.aclosing(self._deltas(request_id, waiter)) as deltas:  # leaving early aborts now
            async for delta in deltas:
                yield delta

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams,
                       request_id: Optional[str] = None, streamed: bool = True) -> Completion:
        """Submit one request and return it finished (its tokens, log-probs and each token's policy version)."""
        [completion] = await self.generate_many([(prompt_token_ids, params, request_id)], streamed)
        return completion

    async def generate_many(self, requests: Sequence[Request], streamed: bool = True) -> list[Completion]:
        """Submit ``requests`` in one command (all enter the engine before the same step) and return them finished,
        in order. ``streamed=False``: the engine reports each request once, at its end (cheaper per step; vLLM's queue
        then refuses ``pause("keep")``, whose kept tokens it would not have)."""
        return list(await asyncio.gather(*await self.submit_many(requests, streamed)))

    async def generate_batch(self, requests: Sequence[Request]) -> list[Completion]:
        """What ``generate_many(requests, streamed=False)`` returns, with one wake-up of this caller for the whole
        batch instead of one per request (a step's batch: the caller's thread stays off the cores while the engine
        steps)."""
        loop = asyncio.get_running_loop()
        batch = _Batch(loop, loop.create_future(), [None] * len(requests), len(requests))
        await self.call(self._submit_batch, list(requests), batch)
        return await batch.future

    async def submit_many(self, requests: Sequence[Request], streamed: bool = True) -> list[Awaitable[Completion]]:
        """Submit ``requests`` in one command; returns, in order, what each caller awaits for its finished
        completion (e.g. the first turns of many agent episodes, which then go on each at its own pace)."""
        return [self._whole(request_id, waiter) for request_id, waiter in await self._open(requests, streamed)]

    async def _open(self, requests: Sequence[Request], streamed: bool) -> list[tuple[str, "_Waiter"]]:
        loop = asyncio.get_running_loop()
        waiters = [_Waiter(loop, asyncio.Queue(), Completion(request_id or "", list(prompt), params))
                   for prompt, params, request_id in requests]
        request_ids = await self.call(self._submit_all, list(requests), waiters, streamed)
        return list(zip(request_ids, waiters))

    async def _deltas(self, request_id: str, waiter: "_Waiter") -> AsyncIterator[Delta]:
        finished = False
        try:
            while not finished:
                item = await waiter.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finish_reason is not None
                yield item
        finally:
            if not finished and not self._closed:
                await self.abort(request_id)

    async def _whole(self, request_id: str, waiter: "_Waiter") -> Completion:
        completion = waiter.completion
        completion.request_id = request_id
        async for delta in self._deltas(request_id, waiter):
            completion.token_ids += delta.token_ids
            completion.log_probs += delta.log_probs
            completion.policy_versions += delta.policy_versions
            completion.finish_reason = delta.finish_reason
        return completion

    async def abort(self, request_id: str) -> Optional[Completion]:
        """End ``request_id`` now (its caller gets a last delta with ``finish_reason="abort"``); ``None`` when it
        had already finished."""
        return await self.call(self._abort, request_id)

    async def pause(self, mode: PauseMode) -> list[Completion]:
        """``abort`` / ``wait`` / ``keep`` (``rollout.vllm_requests``), e.g. around a weight update: callers of kept
        requests go on waiting, and get the rest of their tokens after :meth:`resume`."""
        return await self.call(self._pause, mode)

    async def resume(self) -> list[str]:
        """Generate again; requests kept by ``pause("keep")`` continue (their ids)."""
        return await self.call(self._requests.resume)

    async def call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` on the engine thread between two steps (a weight update, sleep or
        wake) and return its result; its exception is raised here."""
        if self._closed:
            raise ReplicaClosed(self._closed_reason())
        loop = asyncio.get_running_loop()
        command = _Command(lambda: function(*args, **kwargs), loop, loop.create_future())
        self._commands.put(command)
        return await command.future

    def health(self) -> ReplicaHealth:
        """The replica's state now (read without waiting for the engine thread)."""
        since = None if self._last_step is None else time.monotonic() - self._last_step
        alive = not self._closed and (self._thread is None or self._thread.is_alive())
        return ReplicaHealth(alive=alive, in_flight=len(self._waiters) + len(self._batched),
                             paused=self._requests.paused, policy_version=self._version(),
                             engine_steps=self._engine_steps, seconds_since_step=since,
                             error=None if self._error is None else f"{type(self._error).__name__}: {self._error}")

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the engine thread; requests still waiting end with :class:`ReplicaClosed`. Without a thread of its
        own (:meth:`run_here`) it tells the engine loop to end and returns: the loop answers those requests."""
        if self._thread is None:  # the loop's own thread (or serve's) answers whatever waits, never two at once
            if not self._closed:
                self._commands.put(None)
            return
        if not self._closed:
            self._commands.put(None)
            self._thread.join(timeout_s)
        self._fail_waiting(ReplicaClosed(self._closed_reason()))  # a command queued as the thread ended

    # --- the engine thread ----------------------------------------------------------------------------------------

    def run_here(self) -> None:
        """Run the engine loop in the calling thread until :meth:`close` (a server made with ``own_thread=False``)."""
        if self._thread is not None:
            raise RuntimeError("run_here() on a server whose engine has a thread of its own")
        self._serve()

    def _serve(self) -> None:
        torch.set_num_threads(self._torch_threads)
        if self._cuda_device is not None:  # a new thread starts on device 0
            torch.cuda.set_device(self._cuda_device)
        try:
            while True:
                block = not self._requests.has_work() or self._requests.paused is not None
                if not self._run_commands(block):
                    break
                if self._requests.paused is None and self._requests.has_work():
                    self._step()
        except BaseException as error:  # noqa: BLE001 - reported to every waiting caller and by health()
            self._error = error
            logger.error("replica engine loop failed: %s: %s", type(error).__name__, error,
                         exc_info=isinstance(error, Exception))  # an interrupt's traceback says nothing
        finally:
            self._closed = True
            self._fail_waiting(ReplicaClosed(self._closed_reason()))

    def _run_commands(self, block: bool) -> bool:
        """Run the queued commands (waiting for one when ``block``); ``False`` once told to close."""
        while True:
            try:
                command = self._commands.get(block=block)
            except queue.Empty:
                return True
            if command is None:
                return False
            try:
                result = command.run()
            except Exception as error:  # noqa: BLE001 - the caller's mistake, raised in the caller
                _post(command.loop, _settle, command.future, None, error)
            except BaseException as interrupt:  # Ctrl-C, a termination signal: its caller is answered, the loop ends
                _post(command.loop, _settle, command.future, None, ReplicaClosed(
                    f"the replica's engine loop was interrupted: {type(interrupt).__name__}"))
                raise
            else:
                _post(command.loop, _settle, command.future, result, None)
            block = False

    def _step(self) -> None:
        self._deliver(self._requests.step())
        self._engine_steps += 1
        self._last_step = time.monotonic()
        if self._after_step is not None:
            self._after_step(self._requests)

    def _deliver(self, completions: Sequence[Completion]) -> None:
        """Hand each completion's new tokens to its caller: one wake-up of each caller's loop for them all (a
        thread-safe call per request costs a socket write and a thread switch each)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Delta]]] = {}
        for completion in completions:
            if completion.request_id in self._batched:
                self._deliver_batched(completion)
                continue
            waiter = self._waiters.get(completion.request_id)
            if waiter is None:
                continue
            start = waiter.sent
            waiter.sent = len(completion.token_ids)
            if completion.finished:  # before the caller hears of it: health() then counts it done
                del self._waiters[completion.request_id]
            by_loop.setdefault(waiter.loop, []).append((waiter.queue, Delta(
                completion.request_id, completion.token_ids[start:], completion.log_probs[start:],
                completion.policy_versions[start:], completion.finish_reason)))
        for loop, deliveries in by_loop.items():
            _post(loop, _put_each, deliveries)

    def _deliver_batched(self, completion: Completion) -> None:
        if not completion.finished:
            return
        batch, index = self._batched.pop(completion.request_id)
        batch.completions[index] = completion
        batch.remaining -= 1
        if batch.remaining == 0:
            _post(batch.loop, _settle, batch.future, batch.completions, None)

    def _submit_batch(self, requests: list[Request], batch: _Batch) -> None:
        self._submit_into(self._batched, requests, [(batch, index) for index in range(len(requests))], False)
        if not requests:
            _post(batch.loop, _settle, batch.future, [], None)

    def _submit_all(self, requests: list[Request], waiters: list[_Waiter], streamed: bool) -> list[str]:
        return self._submit_into(self._waiters, requests, waiters, streamed)

    def _submit_into(self, answers: dict[str, Any], requests: list[Request], entries: list[Any],
                     streamed: bool) -> list[str]:
        """Queue every request, ``answers[its id]`` = its entry (how its caller is answered); none when one is
        refused (those queued before it are aborted)."""
        request_ids: list[str] = []
        try:
            for (prompt, params, request_id), entry in zip(requests, entries):
                request_ids.append(self._requests.submit(list(prompt), params, request_id=request_id,
                                                         streamed=streamed))
                answers[request_ids[-1]] = entry
        except Exception:
            for request_id in request_ids:
                del answers[request_id]
                self._requests.abort(request_id)
            raise
        return request_ids

    def _abort(self, request_id: str) -> Optional[Completion]:
        if request_id not in self._requests.in_flight:
            return None
        completion = self._requests.abort(request_id)
        self._deliver([completion])
        return completion

    def _pause(self, mode: PauseMode) -> list[Completion]:
        affected = self._requests.pause(mode)
        # abort / wait: their callers are answered now; keep: they wait on
        self._deliver([completion for completion in affected if completion.finished])
        return affected

    def _fail_waiting(self, error: BaseException) -> None:
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.put(error)
        batched, self._batched = self._batched, {}
        for batch, _ in batched.values():
            _post(batch.loop, _settle, batch.future, None, error)
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command is not None:
                _post(command.loop, _settle, command.future, None, error)

    def _closed_reason(self) -> str:
        if self._error is not None:
            return f"the replica's engine thread failed: {type(self._error).__name__}: {self._error}"
        return "the replica's server is closed"


def serve(requests, work: Callable[[ReplicaServer], Awaitable[T]], **server_args: Any) -> T:
    """Run ``work(server)`` on a :class:`ReplicaServer` over ``requests`` for the length of this call and return
    its result; the server closes afterwards. ``server_args``: :class:`ReplicaServer`'s keywords.

    The engine steps in the calling thread and ``work`` runs on an event loop of its own in a helper thread (also
    from inside a running event loop: a notebook). The engine's kernels thus run on the thread whose OpenMP team is
    warm: a thread started per call builds a team of its own, and the two teams' workers contend for the cores (the
    HF engine's tiny-model ``generate`` ran 2.3× slower on a new thread on the 2-core VM)."""
    server = ReplicaServer(requests, own_thread=False, **server_args)
    outcome: dict[str, Any] = {}
    ended = threading.Event()

    def caller() -> None:
        try:
            outcome["result"] = asyncio.run(work(server))
        except BaseException as error:  # noqa: BLE001 - raised in the calling thread
            outcome["error"] = error
        finally:
            server.close()
            ended.set()
    _CALLERS.submit(caller)
    server.run_here()
    while not ended.wait(0.05):  # a command the caller queued as the loop ended is answered, so the caller ends
        server._fail_waiting(ReplicaClosed(server._closed_reason()))
    if server._error is not None and (not isinstance(server._error, Exception)
                                      or isinstance(outcome.get("error"), ReplicaClosed)):
        # an interrupt is the run's, not the work's; an engine failure reaches the caller as itself (its type and
        # traceback: an out-of-memory error stays one), not as the ReplicaClosed its waiters were given
        raise server._error
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _post(loop: asyncio.AbstractEventLoop, function: Callable[..., None], *args: Any) -> None:
    """Run ``function(*args)`` in ``loop``'s thread; nothing when that loop has ended (its caller is gone)."""
    try:
        loop.call_soon_threadsafe(function, *args)
    except RuntimeError:  # "Event loop is closed"
        pass


def _put_each(deliveries: list[tuple[asyncio.Queue, Any]]) -> None:
    for queue_, item in deliveries:
        queue_.put_nowait(item)


def _settle(future: asyncio.Future, result: Any, error: Optional[BaseException]) -> None:
    if future.done():  # cancelled, or a batch failed after it was answered
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
