"""``hybridrl serve``: the gateway on its own — one in-process vLLM engine on a model directory, its replica server
and the OpenAI-compatible HTTP front, until Ctrl-C or SIGTERM. For evaluating a checkpoint with the same agent code
that trains it. Nothing is recorded: sessions are a trainer's, and a server that runs for days must not grow.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

from hybridrl.agents.trajectory import drops_tool_calls
from hybridrl.gateway.app import LOOPBACK, Gateway
from hybridrl.gateway.service import GatewayBackend, GatewayService

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeSettings:
    """Where and how the gateway serves: ``host`` / ``port`` (0: a free one), ``api_key`` (required off loopback),
    the engine's ``max_model_len`` (``None``: the model's positions, at most :data:`DEFAULT_CONTEXT`) and ``dtype``
    (``auto``: as ``hybridrl train`` resolves ``model.dtype: auto`` on this machine), the most new tokens a request
    may ask for (``max_tokens``), the model name reported (``model_name``; default: the directory's name)."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: Optional[str] = None
    max_model_len: Optional[int] = None
    max_tokens: int = 1024
    dtype: str = "auto"
    model_name: Optional[str] = None

    def checked(self) -> "ServeSettings":
        """Mistakes refused before anything loads (``ValueError`` naming the option)."""
        if self.host not in LOOPBACK and not self.api_key:
            raise ValueError(f"--host {self.host} exposes the model to the network: give --api-key (clients send it "
                             "as a bearer token), or keep the default 127.0.0.1")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port {self.port}: a TCP port is 0..65535 (0: any free port)")
        if self.max_tokens < 1 or (self.max_model_len is not None and self.max_model_len < 2):
            raise ValueError("--max-tokens must be ≥ 1 and --max-model-len ≥ 2")
        if self.port:
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind((self.host, self.port))
                except OSError as error:
                    raise ValueError(f"--port {self.port}: cannot listen on {self.host}:{self.port} ({error.strerror}); "
                                     "choose another port (0: any free one)") from None
        return self


DEFAULT_CONTEXT = 2048
"""``--max-model-len`` when not given: the model's positions, but no more than this (a CPU engine sizes its KV cache
for its longest sequences)."""


def for_model(settings: ServeSettings, model_dir: Path) -> ServeSettings:
    """``settings`` with the context length and dtype the model and this machine give (``ValueError`` naming the
    option when an explicit ``--max-model-len`` exceeds the model's positions)."""
    import json

    import torch

    from hybridrl.config.auto_dtype import resolve_dtype

    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    config = config.get("text_config", config)
    positions = config.get("max_position_embeddings", config.get("n_positions"))
    length = settings.max_model_len
    if length is None:
        length = min(positions, DEFAULT_CONTEXT) if isinstance(positions, int) else DEFAULT_CONTEXT
    elif isinstance(positions, int) and length > positions:
        raise ValueError(f"--max-model-len {length}: the model at {model_dir} has {positions} positions "
                         f"(max_position_embeddings); leave --max-model-len out to use them, or give at most {positions}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return replace(settings, max_model_len=length, dtype=resolve_dtype(settings.dtype, device, key="--dtype"))


def serve_model(model_dir: Path, settings: ServeSettings, ready: Callable[[Gateway], None],
                stop: Optional[threading.Event] = None) -> None:
    """Load ``model_dir`` into a vLLM engine and serve it until ``stop`` is set or the process is interrupted
    (``KeyboardInterrupt`` passes through after everything is closed); ``ready(gateway)`` once it listens."""
    from transformers import AutoTokenizer

    from hybridrl.config.schema import RolloutConfig
    from hybridrl.rollout import EngineInputs, build_rollout_engine
    from hybridrl.rollout.server import ReplicaServer

    settings = for_model(settings, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if drops_tool_calls(tokenizer):
        logger.warning("%s: the chat template renders tools but drops an assistant message's tool_calls: when a "
                       "client sends a conversation back, the model will not see its own calls (it was trained on "
                       "the ids it sampled, calls included). Render tool_calls in the template (in the format the "
                       "model writes them) before serving tool-calling agents.", model_dir)
    stop_ids = _stop_ids(model_dir, tokenizer)
    engine = build_rollout_engine("vllm", EngineInputs(
        rollout=RolloutConfig(name="vllm"), pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None
        else stop_ids[0], eos_token_ids=stop_ids, model_path=str(model_dir), max_model_len=settings.max_model_len,
        dtype=settings.dtype))
    server = ReplicaServer(engine.requests, version=lambda: engine.policy_version, name="serve")
    try:
        service = GatewayService(GatewayBackend(server, tokenizer, engine.eos_token_ids, settings.max_model_len,
                                                settings.model_name or Path(model_dir).name, settings.max_tokens),
                                 record_sessions=False, only_its_model_name=True)
        with Gateway(service, settings.host, settings.port, settings.api_key) as gateway:
            ready(gateway)
            stop = stop or threading.Event()
            while not stop.wait(0.5):  # short waits: Ctrl-C and SIGTERM are delivered between them
                pass
    finally:
        server.close()
        close = getattr(engine, "close", None)
        if callable(close):
            close()


def _stop_ids(model_dir: Path, tokenizer) -> list[int]:
    """The tokenizer's EOS and the generation config's (a chat model often ends turns with its own token)."""
    from transformers import GenerationConfig

    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    try:
        extra = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:
        extra = None
    for token in [extra] if isinstance(extra, int) else list(extra or []):
        if token not in ids:
            ids.append(token)
    if not ids:
        raise ValueError(f"{model_dir}: neither the tokenizer nor generation_config.json names an EOS token; the "
                         "gateway could not tell where a reply ends")
    return ids
