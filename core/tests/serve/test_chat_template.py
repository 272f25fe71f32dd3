"""``--chat-template``: bundled names, files and inline text resolve to a template; anything else is refused by name;
the bundled ChatML tools template renders tools, calls and results the way the hermes parser reads them."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest

from paged_core.errors import ConfigError
from paged_core.serve.chat_template import bundled_templates, chat_template_text
from paged_core.serve.tools.hermes import HermesToolParser

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_bundled_file_and_inline_templates_resolve(tmp_path: Path) -> None:
    assert "chatml-tools" in bundled_templates()
    assert "<tool_call>" in chat_template_text("chatml-tools")
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0].content }}", encoding="utf-8")
    assert chat_template_text(str(path)) == "{{ messages[0].content }}"
    assert chat_template_text("{% for m in messages %}{{ m.content }}{% endfor %}").startswith("{% for")


@pytest.mark.parametrize("value", ["no-such-template", "missing/file.jinja", ""])
def test_anything_else_is_refused_by_name(value: str) -> None:
    with pytest.raises(ConfigError, match="--chat-template"):
        chat_template_text(value)


def test_chatml_tools_renders_what_hermes_reads() -> None:
    template = jinja2.Environment().from_string(chat_template_text("chatml-tools"))
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    text = template.render(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": '{"celsius": 21}'},
        ],
        tools=[TOOL],
        add_generation_prompt=True,
    )
    assert text.startswith("<|im_start|>system\nBe brief.\n") and text.count("<|im_start|>system") == 1
    assert json.loads(text.split("<tools>\n")[1].split("\n</tools>")[0]) == TOOL
    assert '<|im_start|>tool\n<tool_response>\n{"celsius": 21}\n</tool_response>' in text
    assert text.endswith("<|im_start|>assistant\n")
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    parsed = HermesToolParser().extract(turn)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("get_weather", {"city": "Paris"})]
