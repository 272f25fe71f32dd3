"""Tool calls through the official ``openai`` client against a live server (uvicorn) started the way
``paged serve --enable-auto-tool-choice --tool-call-parser hermes`` starts it.

The embedded SmolLM2's template does not render tools, and a random-weight model never writes a call, so the
server runs SmolLM2's real tokenizer with a chat template that offers tools (a Hermes-style one) over a scripted
engine core that writes a ``<tool_call>`` answer token by token: everything from the HTTP body to the parsed
``tool_calls`` is the real server's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from paged_core.cli.main import main
from paged_core.engine_core.messages import CoreAbort, CoreFacts, CoreOutputs, CoreRequest, SchedulerStats, SeqDelta
from paged_core.serve import ServeConfig, build_app

from .serve_helpers import MODEL_NAME, ServerThread

TOOLS_TEMPLATE = """
{%- if tools %}<|im_start|>system
Call a function by answering <tool_call>{"name": ..., "arguments": {...}}</tool_call>. Functions:
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{%- for c in m.tool_calls %}
<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>
{%- endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>{{ m.content }}</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
ANSWER = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>'
)
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                "required": ["city"],
            },
        },
    }
]


class ScriptedCore:
    """An engine core whose every sequence writes the token ids of ``script``, one per step, then stops."""

    def __init__(self, tokenizer: Any, script: str) -> None:
        self.tokenizer = tokenizer
        self.script = list(tokenizer.encode(script, add_special_tokens=False))
        self.prompts: list[str] = []
        self.running: dict[str, list[int]] = {}

    def facts(self) -> CoreFacts:
        return CoreFacts(
            model_name=MODEL_NAME,
            model_source="scripted",
            vocab_size=49152,
            eos_token_ids=[],
            max_model_len=4096,
            block_size=16,
            num_usable_blocks=256,
            max_num_seqs=8,
            backend="scripted",
            dtype="float32",
            graph_mode="eager",
            model_path="scripted",
        )

    def stats(self) -> SchedulerStats:
        return SchedulerStats(0.0, 256, 256, len(self.running), 0)

    def close(self) -> None:
        """Nothing to release."""

    def call(self, method: str) -> Any:
        return True

    def add_request(self, request: CoreRequest) -> None:
        assert request.params.n == 1
        self.prompts.append(self.tokenizer.decode(list(request.prompt_token_ids)))
        self.running[request.request_id] = []

    def abort(self, abort: CoreAbort) -> None:
        for rid in abort.request_ids:
            self.running.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def step(self) -> CoreOutputs:
        deltas = []
        for rid, written in list(self.running.items()):
            written.append(self.script[len(written)])
            done = len(written) == len(self.script)
            deltas.append(SeqDelta(rid, 0, [written[-1]], finish_reason="stop" if done else None))
            if done:
                del self.running[rid]
        return CoreOutputs(deltas, self.stats())


@pytest.fixture(scope="module")
def core(tiny_model_dir: Path) -> ScriptedCore:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)  # SmolLM2's
    tokenizer.chat_template = TOOLS_TEMPLATE
    return ScriptedCore(tokenizer, ANSWER)


@pytest.fixture(scope="module")
def client(core: ScriptedCore) -> Iterator[OpenAI]:
    config = ServeConfig(served_model_name=MODEL_NAME, enable_auto_tool_choice=True, tool_call_parser="hermes")
    with ServerThread(build_app(core, config)) as server:
        yield OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def _ask(client: OpenAI, messages: list[Any], **kwargs: Any) -> Any:
    return client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, **kwargs)


def test_tool_calls_whole_and_streamed(client: OpenAI, core: ScriptedCore) -> None:
    r = _ask(client, [{"role": "user", "content": "Weather in Paris?"}])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check.\n"
    (call,) = choice.message.tool_calls or []
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "C"}
    assert json.dumps(TOOLS[0], ensure_ascii=False) in core.prompts[-1]  # the template offered the tools

    content, names, arguments, ids, finishes = "", [], "", [], []
    for chunk in _ask(client, [{"role": "user", "content": "Weather in Paris?"}], stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            assert tc.index == 0
            ids += [tc.id] if tc.id else []
            names += [tc.function.name] if tc.function and tc.function.name else []
            arguments += tc.function.arguments or "" if tc.function else ""
        finishes += [chunk.choices[0].finish_reason] if chunk.choices[0].finish_reason else []
    assert content == "Let me check.\n" and names == ["get_weather"] and finishes == ["tool_calls"]
    assert len(ids) == 1 and ids[0].startswith("call_") and arguments == call.function.arguments


def test_a_tool_result_round_trip_renders(client: OpenAI, core: ScriptedCore) -> None:
    first = _ask(client, [{"role": "user", "content": "Weather in Paris?"}]).choices[0].message
    (call,) = first.tool_calls or []
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    _ask(client, messages)
    prompt = core.prompts[-1]
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}</tool_call>' in prompt
    assert '<tool_response>{"temperature": 21}</tool_response>' in prompt


def test_serve_refuses_an_unknown_parser_before_loading_anything(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--enable-auto-tool-choice", "--tool-call-parser", "nope"]) == 1
    assert "unknown tool-call parser 'nope'; known: hermes, llama3_json" in capsys.readouterr().err
    assert main(["serve", "--enable-auto-tool-choice"]) == 1
    assert "--tool-call-parser" in capsys.readouterr().err
