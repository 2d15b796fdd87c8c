"""A rank of a rollout replica in processes of its own: an engine and nothing else.

Replicas run apart from the actor on a standalone pool (split placement, ``rollout.n_gpus = M``: ``M / t_g``
replicas on devices of their own) or colocated (``rollout.engine_process=own``: ``devices / t_g`` replicas, each
on ``t_g`` of the actor's devices beside its ranks, asleep while the actor trains — GPU memory; a no-op on CPU).
Each replica is its own worker group of ``t_g`` ranks (its own process group: a replica that dies takes no other
down, and its prompts go to a live one — ``trainers/generation.py``). A replica
is one ``t_g``-way tensor-parallel vLLM engine in the same SPMD form as the colocated engine: every rank runs vLLM's
``external_launcher`` executor in-process over the replica's group. There is no training model here: new weights
arrive as the trainer publishes them (``hybrid_engine/publish.py``: a shared arena, the object store or a
process group, ``rollout.weight_transfer``), checked against the trainer's
fingerprints, and each load records the trainer's ``policy_version`` of them, so a generation asked for at another
version is refused (a skipped sync cannot pass silently).
"""

from __future__ import annotations

import random
import time
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

import torch

from hybridrl.agents.lockstep import ReplicaGroup
from hybridrl.config.plugins import load_plugins
from hybridrl.config.rollout_placement import colocated_replicas
from hybridrl.config.schema import TrainConfig
from hybridrl.hybrid_engine.channel import ChannelAddress, WeightChannel
from hybridrl.hybrid_engine.publish import PublicationNotice, PublishedLayout, PublishedWeights
from hybridrl.modeling.model_builder import load_tokenizer
from hybridrl.protocol import Batch
from hybridrl.rollout import EngineInputs, build_rollout_engine
from hybridrl.rollout.base import SamplingParams
from hybridrl.runtime import Worker, dp_leaders, one_to_all, reuse
from hybridrl.utils.seeding import derive_seed
from hybridrl.workers.actor_worker import eos_token_ids
from hybridrl.workers.agent_rollout import engine_context_length, episode_runner
from hybridrl.workers.engine_weights import StaleEngineWeightsError


def generation_eos_ids(model_path: str) -> object:
    """``generation_config.eos_token_id`` of the model directory (``None`` when it has no generation config)."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:
        return None


class RolloutWorker(Worker):
    """One rank of a rollout replica (a standalone pool's, or a colocated one in processes of its own).

    Args:
        config: the validated trainer config (``rollout.name=vllm``; ``rollout.n_gpus > 0`` or
            ``rollout.engine_process`` resolved to ``own``).
    """

    @classmethod
    def process_profile(cls, config: TrainConfig, *args, **kwargs) -> str:
        """``vllm`` for a vLLM replica (a parked process is chosen by it)."""
        return reuse.VLLM if config.rollout.name == "vllm" else reuse.PLAIN

    def __init__(self, config: TrainConfig) -> None:
        load_plugins(config.trainer.plugins)
        torch.manual_seed(config.trainer.seed)
        self.config = config
        tokenizer = load_tokenizer(config.model)
        self.episodes = episodes = episode_runner(config, tokenizer)
        self.engine = build_rollout_engine(config.rollout.name, EngineInputs(
            rollout=config.rollout, pad_token_id=tokenizer.pad_token_id,
            eos_token_ids=eos_token_ids(tokenizer, generation_eos_ids(config.model.path)),
            model_path=config.model.path, tokenizer_path=config.model.tokenizer_path,
            max_model_len=engine_context_length(config, episodes),
            dtype=config.model.dtype, seed=config.trainer.seed))
        self.published: Optional[PublishedWeights] = None
        self.channel: Optional[WeightChannel] = None  # rollout.weight_transfer=collective: from the trainer's ranks
        # the trainer's policy_version of the weights the engine holds (None: random, rollout.load_format=dummy)
        self.policy_version: Optional[int] = 0 if config.rollout.load_format != "dummy" else None
        self.notice: Optional[PublicationNotice] = None  # partial rollout: polled between engine steps
        # on the actor's devices: the engine sleeps but while it generates or loads (rollout.free_cache_engine)
        self.sleeps_between_calls = colocated_replicas(config) and config.rollout.free_cache_engine
        if self.sleeps_between_calls:
            self.engine.release_memory()

    @dp_leaders
    def generate_sequences(self, prompts: Batch, params: SamplingParams,
                           policy_version: Optional[int] = None) -> Batch:
        """Responses for ``prompts`` with ``params`` as given (the caller seeds each chunk of a batch, so a chunk
        resubmitted to another replica samples the same). ``policy_version``: the version the caller expects the
        engine to hold; :class:`StaleEngineWeightsError` otherwise."""
        partial = self.notice is not None  # newer weights may already have landed during an earlier generation
        held = self.policy_version
        if policy_version is not None and not (
                held is not None and (held >= policy_version if partial else held == policy_version)):
            what = "random weights (rollout.load_format=dummy)" if held is None else f"the weights of version {held}"
            raise StaleEngineWeightsError(f"rollout rank {self.rank} holds {what} but generation asked for version "
                                          f"{policy_version}: a weight sync was skipped")
        self._injected_delay(params)
        with self._awake():
            if self.episodes is not None:
                return self.episodes.run(self.engine, prompts, params,
                                         replica=ReplicaGroup.of(self.context.rollout_mesh, self.context.tp_size))
            return self.engine.generate(prompts, params, between_steps=self._take_new_weights if partial else None)

    @contextmanager
    def _awake(self) -> Iterator[None]:
        """The engine awake for one call: a colocated replica gives its memory back to the actor afterwards."""
        if self.sleeps_between_calls:
            self.engine.resume()
        try:
            yield
        finally:
            if self.sleeps_between_calls:
                self.engine.release_memory()

    @one_to_all(collect="first")
    def follow_publications(self, layout: PublishedLayout, notice_path: str) -> None:
        """Partial rollout: map the published arena now and poll ``notice_path`` between engine steps."""
        self._published_for(layout)
        self.notice = PublicationNotice(notice_path)

    def _take_new_weights(self, requests) -> None:
        """Between two engine steps: when a newer publication is posted, park the requests in flight, load it, and
        resume them under the new weights (their next tokens carry its version)."""
        self._injected_step_delay()
        notice = self.notice.read_if_new() if self.notice is not None else None
        if notice is None or notice.policy_version <= self._held() or self.published is None:
            return
        requests.pause("keep")
        self._load(notice.expected, notice.policy_version)
        requests.resume()

    def _injected_delay(self, params: SamplingParams) -> None:
        """``trainer.fault_injection.rollout_delay_s`` (tests only): sleep a random time drawn from the call's seed."""
        longest = self.config.trainer.fault_injection.rollout_delay_s
        if longest > 0:
            time.sleep(random.Random(derive_seed(self.config.trainer.seed, "delay", params.seed or 0)).uniform(
                0, longest))

    @one_to_all(collect="first")
    def load_published_weights(self, layout: PublishedLayout, expected: Optional[torch.Tensor],
                               policy_version: int, rows: Sequence = ()) -> dict[str, float]:
        """Load the trainer's published weights (of ``policy_version``) into the engine; ``expected`` (the
        trainer ranks' fingerprints, summed; ``None``: unchecked) is compared with what this rank read; ``rows``: the
        trainer ranks' object-store references in rank order (``rollout.weight_transfer=object_store``). A load
        that a generation in flight already took (partial rollout) is not repeated. Returns rank 0's sync
        metrics (``weight_sync/bytes``: what it fetched from the object store or received over its channel)."""
        started = time.perf_counter()
        self._published_for(layout)
        if self.notice is None or policy_version > self._held():
            with self._awake():
                self._load(expected, policy_version, rows)
        return {"weight_sync/seconds": time.perf_counter() - started,
                "weight_sync/bytes": float(self.published.fetched_bytes),
                "weight_sync/delivered_bytes": float(self.published.delivered_bytes)}

    def _published_for(self, layout: PublishedLayout) -> PublishedWeights:
        if self.published is None or self.published.layout.path != layout.path:
            self.published = PublishedWeights(layout, self.context.tp_rank, rank=self.rank, channel=self.channel)
        return self.published

    @one_to_all(collect="first")
    def join_weight_channel(self, address: ChannelAddress) -> None:
        """``rollout.weight_transfer=collective``: join the channel the trainer's ranks send weights over, as reader
        ``tp_rank`` (returns once every member has joined)."""
        self.channel = WeightChannel.join(address, address.writers + self.context.tp_rank)
        self.published = None  # rebuilt on the new channel at the next load

    @one_to_all(collect="first")
    def relabel_weights(self, policy_version: int) -> None:
        """The trainer moved on without changing the actor (``trainer.critic_warmup``): the weights held are now
        those of ``policy_version``. Queued behind the generations in flight, as a load would be."""
        if self.policy_version is None:
            raise StaleEngineWeightsError(f"rollout rank {self.rank} holds random weights (rollout.load_format="
                                          "dummy): they cannot be relabelled, a weight sync was skipped")
        self.policy_version = self.engine.policy_version = policy_version

    def _held(self) -> int:
        """The version held, -1 for random weights (any load is newer)."""
        return -1 if self.policy_version is None else self.policy_version

    def _load(self, expected: Optional[torch.Tensor], policy_version: int, rows: Sequence = ()) -> None:
        assert self.published is not None
        self.engine.update_weights(self.published.stream(checked=expected is not None, rows=rows,
                                                         policy_version=policy_version),
                                   policy_version=policy_version)
        if expected is not None:
            self.published.verify(expected)
        self.policy_version = policy_version

    def _injected_step_delay(self) -> None:
        """``trainer.fault_injection.rollout_step_delay_s`` (tests only): a slow engine step, so that new weights
        arrive while a generation is in flight."""
        if self.config.trainer.fault_injection.rollout_step_delay_s > 0:
            time.sleep(self.config.trainer.fault_injection.rollout_step_delay_s)

    def close(self) -> None:
        """Release the engine (a tensor-parallel engine's process groups go before the worker's) and the weight
        channel."""
        close = getattr(getattr(self, "engine", None), "close", None)
        if callable(close):
            close()
        if getattr(self, "channel", None) is not None:
            self.channel.close()
