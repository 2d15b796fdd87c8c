"""OpenAI's chat and completion requests as the gateway takes them (pydantic models), and its error body.

Fields the gateway does not act on (``user``, ``metadata``, ``stream_options`` …) are accepted and ignored, as
OpenAI-compatible servers do; those it cannot honour (``top_logprobs > 0``, ``tool_choice="required"``, a named
tool, ``logit_bias``) are refused with a 400 naming the field instead of being dropped silently.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class GatewayError(Exception):
    """An OpenAI-style error: ``status`` (4xx), ``message``, ``param`` (the field) and ``kind`` (``type``)."""

    def __init__(self, status: int, message: str, param: Optional[str] = None,
                 kind: str = "invalid_request_error", code: Optional[str] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str = "{}"


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[TextPart]]] = None
    tool_calls: Optional[list[ToolCallIn]] = None
    tool_call_id: Optional[str] = None
    name: Optional[str] = None

    def plain(self) -> dict[str, Any]:
        """The message as the session and the chat template see it: text content (parts joined), ``developer`` as
        ``system``, tool calls with their arguments as JSON text."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                                   "content": content or ""}
        if self.tool_calls:
            message["tool_calls"] = [{"id": call.id, "type": "function",
                                      "function": {"name": call.function.name, "arguments": call.function.arguments}}
                                     for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class SamplingFields(BaseModel):
    """What chat and completion requests share."""

    model_config = ConfigDict(extra="allow")
    model: str = ""
    n: int = Field(1, ge=1, le=64)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: Optional[int] = Field(None, ge=1)
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = None
    stream: bool = False
    logit_bias: Optional[dict[str, float]] = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > 4 or any(not stop for stop in stops):
            raise ValueError("stop: up to 4 non-empty strings")
        return stops

    @model_validator(mode="after")
    def _unsupported(self):
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by the gateway")
        return self

    def stop_strings(self) -> list[str]:
        return list(self.stop or [])


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)

    @model_validator(mode="after")
    def _chat_unsupported(self):
        if self.top_logprobs:
            raise ValueError("top_logprobs > 0 is not supported: the gateway reports the sampled token's log-prob")
        if self.tool_choice not in (None, "auto", "none"):
            raise ValueError("tool_choice: only 'auto' and 'none' are supported (the gateway does not force calls)")
        for index, tool in enumerate(self.tools or []):
            if tool.get("type", "function") != "function" or not isinstance(tool.get("function"), dict) \
                    or not tool["function"].get("name"):
                raise ValueError(f"tools[{index}]: expected {{'type': 'function', 'function': {{'name': ...}}}}")
        _check_tool_answers(self.messages)
        return self

    def token_limit(self) -> Optional[int]:
        return self.max_completion_tokens or self.max_tokens


def _check_tool_answers(messages: list[ChatMessage]) -> None:
    """A ``tool`` message that names a call (``tool_call_id``) must answer one an earlier assistant message made, as
    OpenAI requires; one without an id is a plain observation (hybridrl's environments send those)."""
    called: set[str] = set()
    for index, message in enumerate(messages):
        called.update(call.id for call in message.tool_calls or () if call.id)
        if message.role == "tool" and message.tool_call_id and message.tool_call_id not in called:
            raise ValueError(f"messages[{index}].tool_call_id={message.tool_call_id!r} answers no tool call an "
                             "earlier assistant message made")


class CompletionRequest(SamplingFields):
    prompt: Union[str, list[int]]
    logprobs: Optional[int] = Field(None, ge=0, le=5)
    echo: bool = False

    @model_validator(mode="after")
    def _completion_unsupported(self):
        if self.logprobs:
            raise ValueError("logprobs > 0 is not supported: logprobs=0 reports the sampled token's log-prob")
        if self.echo:
            raise ValueError("echo is not supported by the gateway")
        if not self.prompt:
            raise ValueError("prompt: empty")
        return self

    def token_limit(self) -> Optional[int]:
        return self.max_tokens


def validation_error(errors: list[dict]) -> GatewayError:
    """pydantic's errors → one 400 naming the first bad field (``messages.0.role``)."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    location = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    return GatewayError(400, f"{location}: {message}" if location else message, param=location or None)
