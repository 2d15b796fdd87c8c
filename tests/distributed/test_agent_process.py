"""Agents in a process of their own (``hybridrl/gateway/agent_process.py``) against a real gateway over a real vLLM
engine (CPU build, tiny model): the same episodes as on the caller's event loop, token for token; an agent that
blocks its event loop or kills its process fails its batch's episodes, saying why, and the next batch runs in a
fresh process; an agent that cannot be loaded is the run's error, naming the key; another virtual environment's
interpreter plays the same episodes."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from transformers import AutoTokenizer
from vllm_helpers import cpu_engine

from hybridrl.gateway.agent_process import AgentProcess
from hybridrl.gateway.app import Gateway
from hybridrl.gateway.episodes import InProcess, load_agent, run_episodes
from hybridrl.gateway.service import GatewayBackend, GatewayService
from hybridrl.rollout.server import ReplicaServer
from hybridrl.utils.tiny_model import save_tiny_model

pytest.importorskip("openai", reason="needs the openai client (pip install 'hybridrl[test]')")
pytest.importorskip("vllm", reason="needs vLLM (pip install 'hybridrl[cpu]')")
pytestmark = pytest.mark.distributed

MAX_MODEL_LEN = 256
AGENT_FILE = '''
import asyncio
import os
import sys
import time

from hybridrl.gateway.episodes import AgentResult


async def agent(row, client):
    if row.get("blocks_s"):
        time.sleep(row["blocks_s"])  # a synchronous call inside an async agent: its event loop stops
    if row.get("exits"):
        os._exit(3)
    if row.get("stubborn"):
        while True:  # swallows its cancellation: the episode times out, the task lives on
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                continue
    if row.get("info"):
        return AgentResult(reward=1.0, info=row["info"])
    if row.get("prefix_file"):
        with open(row["prefix_file"], "w") as file:
            file.write(sys.prefix)
    messages = [{"role": "user", "content": row["question"]}]
    for _ in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6,
                                                     temperature=0)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                     {"role": "tool", "content": "7"}]
    return AgentResult(reward=float(len(row["question"])), info={"pid": float(os.getpid())})
'''


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    model_dir = save_tiny_model(tmp_path_factory.mktemp("agent_process") / "model", tool_chat=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = cpu_engine(model_dir, tokenizer, max_model_len=MAX_MODEL_LEN)
    server = ReplicaServer(engine.requests, version=lambda: engine.policy_version)
    service = GatewayService(GatewayBackend(server, tokenizer, engine.eos_token_ids, MAX_MODEL_LEN, max_tokens=32))
    with Gateway(service) as served:
        yield served
    server.close()
    engine.close()


@pytest.fixture(scope="module")
def agent_name(tmp_path_factory):
    path = tmp_path_factory.mktemp("agent_file") / "my_agent.py"
    path.write_text(AGENT_FILE)
    return f"{path}:agent"


def play(player, rows, gateway, **options):
    return asyncio.run(run_episodes(player, rows, gateway, **options))


def test_a_process_of_its_own_plays_the_same_episodes_as_the_callers_loop(gateway, agent_name):
    rows = [{"question": f"{index}*13="} for index in range(6)]
    process = AgentProcess(agent_name)
    try:
        in_child = play(process, rows, gateway)
        again = play(process, rows[:2], gateway)  # the process is kept: same pid
    finally:
        process.close()
    in_caller = play(InProcess(load_agent(agent_name)), rows, gateway)
    assert [episode.failure for episode in in_child] == [None] * 6
    assert {episode.info["pid"] for episode in in_child + again} != {float(os.getpid())}
    assert len({episode.info["pid"] for episode in in_child + again}) == 1
    for child, caller, row in zip(in_child, in_caller, rows):
        assert child.reward == caller.reward == float(len(row["question"]))
        assert [call.completion_ids for call in child.record.calls] == \
               [call.completion_ids for call in caller.record.calls]
        assert [call.prompt_ids for call in child.record.calls] == [call.prompt_ids for call in caller.record.calls]
        assert len(child.record.calls) == 2


def test_a_blocked_or_dead_process_fails_its_batch_saying_why_and_the_next_batch_gets_a_new_one(gateway, agent_name):
    process = AgentProcess(agent_name, grace_s=2.0)
    try:
        [first] = play(process, [{"question": "5*2="}], gateway)
        blocked = play(process, [{"question": "1*2=", "blocks_s": 30}, {"question": "2*2="}], gateway, timeout_s=1.0)
        assert [episode.failure for episode in blocked] == [
            "the agent process answered no batch in 5 s (an agent that blocks its event loop, e.g. with time.sleep "
            "or a synchronous client, stops every episode in it)"] * 2
        with pytest.raises(ProcessLookupError):
            os.kill(int(first.info["pid"]), 0)  # the blocked process is gone, not left behind
        dead = play(process, [{"question": "1*2=", "exits": True}], gateway)
        assert [episode.failure for episode in dead] == ["the agent process died (exit code 3)"]
        [fine] = play(process, [{"question": "3*2="}], gateway)
        assert fine.failure is None and fine.reward == 4.0 and len(fine.record.calls) == 2
    finally:
        process.close()


def test_an_agent_that_ignores_cancellation_loses_only_its_episode(gateway, agent_name):
    """Its episode times out; the others of the batch keep their outcomes; the process it was left running in
    ends after replying, and the next batch runs in a fresh one."""
    process = AgentProcess(agent_name, grace_s=30.0)
    try:
        started = time.monotonic()
        batch = play(process, [{"question": "1*2=", "stubborn": True}, {"question": "2*2="},
                               {"question": "3*2=", "info": {"turns": "two"}}], gateway, timeout_s=2.0)
        assert time.monotonic() - started < 20  # not the batch deadline (2 + 2 + 30 s)
        assert batch[0].failure == "the agent took longer than 2 s"
        assert batch[1].failure is None and batch[1].reward == 4.0
        assert batch[2].failure == "the agent raised TypeError: AgentResult.info['turns'] = 'two' is not a number"
        [after] = play(process, [{"question": "4*2="}], gateway)
        assert after.failure is None and after.info["pid"] != batch[1].info["pid"]
    finally:
        process.close()


def test_an_agent_the_process_cannot_load_is_the_runs_error_naming_the_key(gateway, tmp_path):
    process = AgentProcess(f"{tmp_path / 'missing.py'}:agent")
    try:
        with pytest.raises(ValueError, match="rollout.multi_turn.agent"):
            play(process, [{"question": "1*2="}], gateway)
    finally:
        process.close()


def test_another_interpreter_plays_the_same_episodes(gateway, agent_name, tmp_path):
    """``rollout.multi_turn.agent_python``: the child runs the venv's interpreter, and what it plays is the same."""
    from other_python import make_venv

    venv = tmp_path / "agents-venv"
    python = make_venv(venv, sees_this_environment=True)
    rows = [{"question": f"{index}*7=", "prefix_file": str(tmp_path / f"prefix-{index}")} for index in range(3)]
    process = AgentProcess(agent_name, python=str(python))
    try:
        elsewhere = play(process, rows, gateway)
    finally:
        process.close()
    here = play(InProcess(load_agent(agent_name)), [{"question": row["question"]} for row in rows], gateway)
    assert {(tmp_path / f"prefix-{index}").read_text() for index in range(3)} == {str(venv)}
    for there, local in zip(elsewhere, here):
        assert there.failure is None and there.reward == local.reward
        assert [call.completion_ids for call in there.record.calls] == \
               [call.completion_ids for call in local.record.calls]


def test_agents_that_edit_their_rows_leave_the_callers_rows_alone(gateway, agent_name):
    """Rows are copied per episode on the caller's loop, and cross to a process as copies."""
    async def editing(row, client):
        row["prompt"].append({"role": "user", "content": "edited"})
        return 1.0

    rows = [{"prompt": [{"role": "user", "content": "1*2="}], "question": "1*2="}] * 2  # one dict, twice
    [first, second] = play(InProcess(editing), rows, gateway)
    assert first.failure is None and second.failure is None
    assert rows[0]["prompt"] == [{"role": "user", "content": "1*2="}]
