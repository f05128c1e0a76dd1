"""The request bodies of the OpenAI endpoints, as pydantic models.

Unknown fields are ignored, as OpenAI's API does; a wrong type or range is an HTTP 400
with OpenAI's error object (see :mod:`mobius_runtime.serve.errors`). ``temperature`` 0
means greedy. Beside OpenAI's fields the sampling extras vLLM and llama.cpp's server
take are accepted: ``top_k``, ``min_p``, ``repetition_penalty``. ``response_format``
(``json_object`` / ``json_schema``) constrains the output (:mod:`mobius_runtime.constrained`).
Fields of OpenAI's API that the runtime does not implement yet are refused with a 400
naming the field when they ask for something (``null``, ``false``, ``[]`` and
``tool_choice: "none"`` ask for nothing and are accepted).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mobius_runtime.sampling import MAX_LOGPROBS
from mobius_runtime.serve.errors import ApiError

MAX_STOPS = 4  # OpenAI's limit on the number of stop strings
MAX_CHOICES = 16  # n: choices one request may ask for (each is a batch row)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ImageURL(_Body):
    url: str


class ImagePart(_Body):
    type: Literal["image_url"]
    image_url: ImageURL


class InputAudio(_Body):
    data: str
    format: Literal["wav", "mp3", "flac"]


class AudioPart(_Body):
    type: Literal["input_audio"]
    input_audio: InputAudio


Part = Annotated[TextPart | ImagePart | AudioPart, Field(discriminator="type")]


class FunctionCall(_Body):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallIn(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Part] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message answers this call


class FunctionDef(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Body):
    include_usage: bool = False


class JsonSchemaFormat(_Body):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = Field(max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _Sampling(_Body):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=1e6)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | Annotated[list[str], Field(max_length=MAX_STOPS)] | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    user: str | None = None
    response_format: ResponseFormat | None = None

    def check_supported(self) -> None:
        """A 400 naming the first field whose value contradicts another's."""

    def logprob_k(self) -> int | None:
        """How many likeliest tokens each logprobs entry lists (None: no logprobs)."""
        return None

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    def check_supported(self) -> None:
        if self.top_logprobs and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")

    def logprob_k(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def tool_list(self) -> list[dict[str, Any]] | None:
        """The tools as HF's ``apply_chat_template(tools=...)`` takes them (None: none,
        or ``tool_choice: "none"``, which keeps them out of the prompt)."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def forced(self) -> tuple[bool, str | None]:
        """(a call is required, the function it must be or None for any of the tools)."""
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            if not any(t.function.name == choice.function.name for t in self.tools or ()):
                raise ApiError(
                    400,
                    f"tool_choice names the function {choice.function.name!r}, which is not "
                    "in tools",
                    "tool_choice",
                )
            return True, choice.function.name
        if choice == "required" and not self.tools:
            raise ApiError(400, 'tool_choice "required" needs tools', "tool_choice")
        return choice == "required", None

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[int] = Field(min_length=1)
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    def logprob_k(self) -> int | None:
        return self.logprobs

    def token_limit(self) -> int | None:
        return self.max_tokens


class TokenizeRequest(_Body):
    model: str
    prompt: str | list[int] | None = None
    messages: list[Message] | None = Field(None, min_length=1)
    tools: list[Tool] | None = None


class DetokenizeRequest(_Body):
    model: str
    tokens: list[int] = Field(max_length=1_000_000)
