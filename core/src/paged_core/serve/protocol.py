"""Request bodies of the OpenAI API (plus vLLM's common extras), validated strictly.

Unknown top-level fields are refused, as OpenAI does, and types are strict:
``"5"`` is not an int. Range checks are left to :class:`SamplingParams`,
whose errors name the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from paged_core.serve.tools.request import MessageToolCall, Tool, ToolChoice

TokenIds = list[int]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    """``stream_options``: ``include_usage`` adds a final chunk carrying the usage."""

    include_usage: bool = False


class JsonSchemaFormat(_Strict):
    """``response_format.json_schema``: the schema the output must match (``strict`` is accepted; the grammar
    always enforces the schema)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """``response_format``: ``text`` (no constraint), ``json_object`` (any JSON object) or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsField(_Strict):
    """vLLM's ``structured_outputs`` body field: set exactly one constraint."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class _SamplingFields(_Strict):
    """Fields shared by completions and chat completions."""

    model: str
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM-style extras (the openai client sends them through extra_body).
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    speculate: bool = True
    """False: no speculative drafts for this request (where the server runs speculative decoding)."""
    cache_salt: str | None = Field(default=None, min_length=1)
    priority: int = 0
    return_token_ids: bool | None = None
    """vLLM's: the prompt's token ids (``prompt_token_ids``) and each choice's (``token_ids``) in the response."""
    # Structured outputs: at most one of these (see paged_core.serve.constraints).
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``: ``prompt`` is text, token ids, or a list of either."""

    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    # vLLM's beam-search extras: n (or best_of, which must equal it) is the beam width; every beam comes back.
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False


class TextPart(_Strict):
    """A text part of a message's content list (images and audio are not supported)."""

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One conversation turn (an assistant's earlier ``tool_calls``, a ``tool`` result's ``tool_call_id``);
    unknown keys are tolerated and ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The content as one string (text parts joined by newlines)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class TokenizeRequest(_Strict):
    """``POST /tokenize``: text (``prompt``) or a conversation (``messages``) to token ids."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Strict):
    """``POST /detokenize``: token ids to text."""

    model: str | None = None
    tokens: TokenIds


class LoadLoRAAdapterRequest(_Strict):
    """``POST /v1/load_lora_adapter`` (with runtime updates on): serve the PEFT adapter at ``lora_path`` as the
    model ``lora_name``."""

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLoRAAdapterRequest(_Strict):
    """``POST /v1/unload_lora_adapter`` (with runtime updates on): stop serving the adapter ``lora_name``."""

    lora_name: str = Field(min_length=1)
