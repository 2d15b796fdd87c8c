"""Multi-turn demonstrations (SFT) in the same token layout as the agent loop's trajectories.

A demonstration is a prompt and its turns (``SFTExample.turns``): each ``assistant`` turn is encoded as the chat
template's own ids for it, up to and including its stop token (what the model must learn to emit: mask 1); each run
of other messages (tool results) is encoded by :meth:`ChatRenderer.observation_ids`, exactly as the agent loop
encodes observations at run time (mask 0). SFT on these rows and RL on the loop's rows therefore see the same ids
for the same conversation.
"""

from __future__ import annotations

from typing import Sequence

from hybridrl.agents.batch import trajectories_to_batch
from hybridrl.agents.trajectory import ChatRenderer, Message, Trajectory
from hybridrl.protocol import Batch, Fields


def conversation_trajectory(renderer: ChatRenderer, prompt: Sequence[Message], turns: Sequence[Message],
                            stop_id: int, where: str = "") -> Trajectory:
    """The trajectory of a written conversation; ``ValueError`` (naming ``where``) when the template cannot encode
    it prefix-exactly."""
    history = list(prompt)
    trajectory = Trajectory(prompt_ids=renderer.prompt_ids(history))
    pending: list[Message] = []
    for message in turns:
        if message.get("role") != "assistant":
            pending.append(dict(message))
            continue
        if pending:
            ids, matched = renderer.observation_ids(history, pending, trajectory.ids)
            if not matched:
                raise ValueError(f"{where or 'demonstration'}: the chat template does not encode it prefix-exactly")
            history += pending
            trajectory.add_observation(ids)
            pending = []
        trajectory.add_model_turn(*_model_turn(renderer, history, message, trajectory.ids, stop_id, where))
        history.append(dict(message))
        trajectory.final_text = str(message.get("content", ""))
    return trajectory


def _model_turn(renderer: ChatRenderer, history: list[Message], message: Message, ids_so_far: list[int],
                stop_id: int, where: str) -> tuple[list[int], list[float], list[int]]:
    if history and history[-1].get("role") == "assistant":
        raise ValueError(f"{where or 'demonstration'}: two assistant turns in a row (put the environment's reply "
                         "between them)")
    rendered = renderer.ids([*history, message], generation_prompt=False)
    if rendered[:len(ids_so_far)] != ids_so_far:
        raise ValueError(f"{where or 'demonstration'}: the chat template does not encode it prefix-exactly")
    rest = rendered[len(ids_so_far):]
    if stop_id not in rest:
        raise ValueError(f"{where or 'demonstration'}: the template ends an assistant turn without the stop token "
                         f"{stop_id}")
    ids = rest[:rest.index(stop_id) + 1]
    return ids, [0.0] * len(ids), [0] * len(ids)


def encode_conversations(tokenizer, examples: Sequence, response_length: int, tools: Sequence[dict],
                         max_prompt_length: int = 0) -> Batch:
    """``SFTExample``s with ``turns`` → a rollout-layout batch (``agents/batch.py``): the loss on the demonstrated
    assistant turns only. ``ValueError`` naming the example when a conversation is longer than ``response_length``."""
    renderer = ChatRenderer(tokenizer, tools)
    trajectories = []
    for row, example in enumerate(examples):
        where = example.where or f"SFT example {row}"
        trajectory = conversation_trajectory(renderer, _messages(example.prompt), example.turns,
                                             tokenizer.eos_token_id, where)
        if len(trajectory.response_ids) > response_length:
            raise ValueError(f"{where}: its turns are {len(trajectory.response_ids)} ids, more than "
                             f"data.max_response_length={response_length}")
        trajectories.append(trajectory)
    rows = Batch(non_tensors={Fields.UID: [f"sft{row}" for row in range(len(examples))]})
    width = max_prompt_length and max(max_prompt_length, max(len(t.prompt_ids) for t in trajectories))
    return trajectories_to_batch(trajectories, rows, response_length, tokenizer.pad_token_id, width)


def _messages(prompt) -> list[Message]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
