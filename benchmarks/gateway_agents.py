"""The same multi-turn workload through the OpenAI-compatible gateway and through the in-process agent loop.

    PYTHONPATH=. python benchmarks/gateway_agents.py [--size medium] [--episodes 32] [--turns 3] [--tokens 16]
        [--rounds 3]

One vLLM engine (CPU build, a tool-chat model built from a config — ``tiny``: the tests' 2-layer model, whose engine
step is well under a millisecond; ``medium``: 8 layers of width 512 — fp32, one torch thread) serves both sides:

- ``agent loop``: ``hybridrl.agents.loop.AgentLoop`` with an environment that answers every model turn with a tool
  message at once, for ``--turns`` model turns per episode;
- ``gateway``: ``hybridrl.gateway.episodes.run_episodes`` with an ``async def agent(row, client)`` that makes the
  same calls with the ``openai`` client over HTTP (localhost), appending the same tool message each turn — played
  in a process of its own (``AgentProcess``: the trainer's default, ``rollout.multi_turn.agent_process``), and on
  the engine's own event loop (``InProcess``).

Each episode's turns are seeded alike on both sides. The sides alternate round by round; reported: median wall
seconds per batch, model tokens generated per second, and each gateway side ÷ the agent loop (the target: the
trainer's default at ≥ 0.9× the loop's throughput). Writes ``benchmarks/results/gateway_agents.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import common


SIZES = {"tiny": {}, "medium": dict(hidden_size=512, num_layers=8, num_heads=16, num_kv_heads=4,
                                    intermediate_size=1408)}


def build(workdir: Path, max_model_len: int, size: str = "tiny"):
    import torch

    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    from hybridrl.config.schema import RolloutConfig
    from hybridrl.rollout import EngineInputs, build_rollout_engine
    from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model

    model_dir = save_tiny_model(workdir / "model", TinyModelSpec(**SIZES[size]), tool_chat=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = build_rollout_engine("vllm", EngineInputs(
        rollout=RolloutConfig(name="vllm", max_num_seqs=64, max_num_batched_tokens=2048),
        pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id], model_path=str(model_dir),
        max_model_len=max_model_len, dtype="float32"))
    return engine, tokenizer


def loop_side(engine, tokenizer, args) -> int:
    """One batch through the agent loop; the model tokens generated."""
    from hybridrl.agents.environment import Environment, StepResult
    from hybridrl.agents.loop import AgentLoop, LoopLimits
    from hybridrl.agents.trajectory import ChatRenderer
    from hybridrl.rollout.base import SamplingParams

    class ToolEcho(Environment):
        def __init__(self) -> None:
            self.turns = 0

        def step(self, model_text: str) -> StepResult:
            self.turns += 1
            done = self.turns >= args.turns
            return StepResult(observations=[] if done else [{"role": "tool", "content": f"ok {self.turns}"}],
                              done=done)

    loop = AgentLoop(engine.requests, ChatRenderer(tokenizer), LoopLimits(
        max_assistant_turns=args.turns, max_response_tokens=args.turns * (args.tokens + 16)),
        stop_ids=engine.eos_token_ids)
    rows = [{"prompt": [{"role": "user", "content": f"{index}*7="}]} for index in range(args.episodes)]
    params = [SamplingParams(max_new_tokens=args.tokens, seed=index) for index in range(args.episodes)]
    trajectories = loop.run([ToolEcho() for _ in rows], rows, params)
    return sum(sum(trajectory.response_mask) for trajectory in trajectories)


async def agent(row, client):
    """The benchmark's agent (importable by name: the ``agent process`` side plays it in a process of its own)."""
    messages = [{"role": "user", "content": row["question"]}]
    for turn in range(row["turns"]):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=row["tokens"],
                                                     seed=row["seed"] + turn)
        messages += [reply.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "content": f"ok {turn + 1}"}]
    return 0.0


def gateway_side(gateway, args, player) -> int:
    from hybridrl.gateway.episodes import run_episodes

    rows = [{"question": f"{index}*7=", "seed": index, "turns": args.turns, "tokens": args.tokens}
            for index in range(args.episodes)]
    episodes = asyncio.run(run_episodes(player, rows, gateway))
    failures = [episode.failure for episode in episodes if episode.failure]
    assert not failures, failures[:3]
    return sum(len(call.completion_ids) for episode in episodes for call in episode.record.calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="medium", choices=sorted(SIZES))
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from hybridrl.gateway.agent_process import AgentProcess
    from hybridrl.gateway.app import Gateway
    from hybridrl.gateway.episodes import InProcess
    from hybridrl.gateway.service import GatewayBackend, GatewayService
    from hybridrl.rollout.server import ReplicaServer

    machine = common.machine_info()
    max_model_len = 256
    with tempfile.TemporaryDirectory() as tmp:
        engine, tokenizer = build(Path(tmp), max_model_len, args.size)
        process = AgentProcess(f"{Path(__file__).resolve()}:agent", key="benchmark agent")

        def gateway_round(player) -> int:
            server = ReplicaServer(engine.requests, version=lambda: engine.policy_version)
            service = GatewayService(GatewayBackend(server, tokenizer, engine.eos_token_ids, max_model_len))
            try:
                with Gateway(service) as gateway:
                    return gateway_side(gateway, args, player)
            finally:
                server.close()
        sides = {"agent loop": lambda: loop_side(engine, tokenizer, args),
                 "gateway, agents in a process": lambda: gateway_round(process),
                 "gateway, agents in the engine's": lambda: gateway_round(InProcess(agent))}
        results: dict[str, list[tuple[float, int]]] = {name: [] for name in sides}
        for name in sides:  # warm-up
            sides[name]()
        for round_index in range(args.rounds):
            for name in (list(sides) if round_index % 2 == 0 else list(sides)[::-1]):
                started = time.perf_counter()
                tokens = sides[name]()
                results[name].append((time.perf_counter() - started, tokens))
                print(f"[gateway_agents] round {round_index + 1}: {name}: {results[name][-1][0]:.2f} s, "
                      f"{tokens} tokens", flush=True)
        process.close()
        engine.close()
    rows, summary = [], {}
    for name, runs in results.items():
        seconds = common.median([run[0] for run in runs])
        rate = common.median([run[1] / run[0] for run in runs])
        summary[name] = {"seconds": seconds, "tokens_per_s": rate, "runs": runs}
        rows.append([name, f"{seconds:.2f}", f"{rate:.0f}"])
    loop_rate = summary["agent loop"]["tokens_per_s"]
    ratios = {name: summary[name]["tokens_per_s"] / loop_rate for name in summary if name != "agent loop"}
    load = machine["load_average_1m_5m_15m_at_start"][0]
    print(f"gateway_agents ({args.size} model): {args.episodes} episodes × {args.turns} turns × ≤ {args.tokens} "
          f"tokens, median of {args.rounds} alternating rounds (load average at start {load:.1f})")
    print(common.markdown_table(["side", "s per batch", "model tokens/s"], rows))
    for name, ratio in ratios.items():
        print(f"{name} ÷ agent loop throughput: {ratio:.2f}×")
    common.write_json("gateway_agents", {"machine": machine, "args": vars(args), "results": summary,
                                         "ratios": ratios})


if __name__ == "__main__":
    main()
