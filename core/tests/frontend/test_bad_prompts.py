"""LLM.generate and LLM.chat refuse a prompt that is neither text nor token ids by its index and type, alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from paged_core.errors import RequestRejectedError
from paged_core.frontend.llm import LLM
from paged_core.frontend.outputs import RequestOutput
from paged_core.sampling.params import SamplingParams

from ..engine_helpers import all_blocks_free, make_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=3)
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def llm(tiny_loaded: Any) -> LLM:
    """An LLM over the shared tiny weights, built as :meth:`LLM.reconfigured` builds its clones."""
    llm = LLM.__new__(LLM)
    llm.engine = make_engine(tiny_loaded)
    return llm


def completed(out: RequestOutput) -> bool:
    return out.error is None and out.finished and len(out.outputs[0].token_ids) == GREEDY.max_tokens


def test_an_int_among_text_prompts_is_refused_alone(llm: LLM) -> None:
    outs = llm.generate(["ok", 5], GREEDY, use_tqdm=False)
    assert completed(outs[0])
    assert outs[1].error == "prompt 1 must be text (str) or a list of token ids (int); got int"
    assert outs[1].finished and not outs[1].outputs and outs[1].prompt is None
    assert all_blocks_free(llm.engine)


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (b"hi", "got bytes (decode it to text first)"),
        (bytearray(b"hi"), "got bytearray (decode it to text first)"),
        (memoryview(b"hi"), "got memoryview (decode it to text first)"),
        ([1, 2, True], "got a list whose item 2 is bool"),
        ([1.0, 2.0], "got a list whose item 0 is float"),
        ([1, None], "got a list whose item 1 is NoneType"),
        ({"text": "hi"}, "got dict"),
        ({"role": "user", "content": "hi"}, "got dict (a chat message: use chat())"),
        (np.array([1.0, 2.0]), "got a ndarray whose item 0 is float64"),
        (np.array([True, False]), "got a ndarray whose item 0 is bool"),
        (7, "got int"),
        (None, "got NoneType"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_a_lone_bad_prompt_is_raised_naming_index_0_and_its_type(llm: LLM, bad: Any, named: str) -> None:
    with pytest.raises(RequestRejectedError) as info:
        llm.generate(bad, GREEDY, use_tqdm=False)
    assert str(info.value) == f"prompt 0 must be text (str) or a list of token ids (int); {named}"
    assert all_blocks_free(llm.engine)


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (b"hi", "got bytes"),
        ([[1, 2], [3]], "got a list whose item 0 is list"),
        ([1, True], "got a list whose item 1 is bool"),
        ((4, 5.5), "got a tuple whose item 1 is float"),
        ({"text": "hi"}, "got dict"),
        (np.array([[1, 2]]), "got a 2-D numpy array"),
        ({1, 2}, "got set"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_in_a_batch_the_others_complete(llm: LLM, bad: Any, named: str) -> None:
    outs = llm.generate(["ok", [10, 11, 12], bad, "fine"], GREEDY, use_tqdm=False)
    assert [completed(o) for o in outs] == [True, True, False, True]
    assert outs[2].error is not None and outs[2].error.startswith("prompt 2 must be text (str) or a list of token ids")
    assert named in outs[2].error
    assert all_blocks_free(llm.engine)


def test_numpy_token_ids_are_accepted_as_ints(llm: LLM) -> None:
    ids = [10, 11, 12, 13]
    expected = llm.generate([ids], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    for prompt in (np.array(ids), np.array(ids, dtype=np.int32), [np.int64(t) for t in ids], tuple(ids)):
        out = llm.generate(prompt, GREEDY, use_tqdm=False)
        assert len(out) == 1 and out[0].outputs[0].token_ids == expected
    rows = llm.generate(np.array([ids, ids]), GREEDY, use_tqdm=False)  # a 2-D array is a batch of rows
    assert [o.outputs[0].token_ids for o in rows] == [expected, expected]


def test_other_refusals_still_name_the_prompt(llm: LLM) -> None:
    outs = llm.generate(["", 5, "ok"], GREEDY, use_tqdm=False)
    assert outs[0].error == "prompt 0: prompt is empty"
    assert outs[1].error is not None and outs[1].error.startswith("prompt 1 must be text")
    assert completed(outs[2])
    with pytest.raises(RequestRejectedError, match=r"^prompt is empty$"):  # all refused: the first is raised
        llm.generate(["", 5], GREEDY, use_tqdm=False)


def test_add_request_refuses_a_bad_type_with_an_input_error(llm: LLM) -> None:
    with pytest.raises(
        RequestRejectedError, match=r"^prompt must be text \(str\) or a list of token ids \(int\); got bytes"
    ):
        llm.engine.add_request(b"hi")
    assert not llm.engine.has_unfinished_requests()


def test_beam_search_refuses_a_bad_prompt_alone(llm: LLM) -> None:
    outs = llm.beam_search(["ok", b"no"], beam_width=2, max_tokens=2, use_tqdm=False)
    assert outs[0].error is None and len(outs[0].sequences) == 2
    assert outs[1].error is not None and "prompt 1 must be text" in outs[1].error and "got bytes" in outs[1].error


def test_chat_refuses_a_bad_conversation_alone(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm.tokenizer, "chat_template", TEMPLATE, raising=False)
    good = [{"role": "user", "content": "hi"}]
    outs = llm.chat([good, [{"text": "no role"}], "not a conversation", good], GREEDY, use_tqdm=False)
    assert [completed(o) for o in outs] == [True, False, False, True]
    assert outs[1].error is not None and outs[1].error.startswith("conversation 1: messages[0] must be a dict")
    assert outs[2].error == "conversation 2: must be a list of {'role', 'content'} dicts; got str"
    with pytest.raises(RequestRejectedError, match=r"^conversation 0: must be a list .*; got dict$"):
        llm.chat({"role": "user", "content": "hi"}, GREEDY, use_tqdm=False)  # type: ignore[arg-type]
    assert completed(llm.chat(good, GREEDY, use_tqdm=False)[0])
