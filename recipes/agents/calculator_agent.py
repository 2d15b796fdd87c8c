"""Bring your own agent: plain OpenAI-client code with a calculator tool (README, "Bring your own agent")."""
import json

from hybridrl.agents.builtin_tools import calculator

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression, e.g. 37*58",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


async def agent(row, client):
    messages = list(row["prompt"])
    for _ in range(3):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return None  # no tool call: the answer; the data source's reward function scores it
        for call in message.tool_calls:
            try:
                result = calculator(**json.loads(call.function.arguments))
            except (ValueError, TypeError) as error:
                result = f"error: {error}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None
