"""The request bodies of the OpenAI endpoints, as pydantic models.

Unknown fields are ignored, as OpenAI's API does; a wrong type or range is an HTTP 400
with OpenAI's error object (see :mod:`mobius_runtime.serve.errors`). Only what the
runtime can honour is accepted: ``n`` must be 1; ``temperature`` 0 means greedy.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


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


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[Part] | None = None


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = Field(None, max_length=4)
    n: int = Field(1, ge=1, le=1)
    user: str | None = None

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[int] = Field(min_length=1)
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions

    def token_limit(self) -> int | None:
        return self.max_tokens
