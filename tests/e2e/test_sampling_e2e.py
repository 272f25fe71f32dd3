"""Sampling through the whole engine: seeds, n > 1 with copy-on-write, stop strings, logprobs, metrics."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from paged_bench.hf_runs import attention
from paged_core import LLM, SamplingParams

pytestmark = pytest.mark.usefixtures("exact_activations")  # logprobs bit for bit and against transformers: fp32

SEEDED = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=24, ignore_eos=True)


def test_seeded_request_gives_the_same_text_alone_and_in_a_batch(smol_base: LLM) -> None:
    """Same tokens and the same logprobs, bit for bit: alone every step has one row, in the batch two to five
    (the others finish at other lengths), so this holds only if a row's numbers do not depend on its
    batch-mates (the cpu backend's exact path; in- and out-of-process schedules differ the same way)."""
    prompt = "Write one sentence about the sea."
    seeded = replace(SEEDED, logprobs=2)
    alone = smol_base.generate([prompt], seeded, use_tqdm=False)[0].outputs[0]
    others = ["Tell me a joke.", "List some colours:", "Why is the sky blue?", "Count to five:"]
    params = [
        SamplingParams(temperature=1.0, max_tokens=30),
        seeded,
        replace(seeded, seed=7),
        SamplingParams(temperature=0.0, max_tokens=10),
        SamplingParams(temperature=0.7, top_k=5, max_tokens=20),
    ]
    batch = smol_base.generate([others[0], prompt, *others[1:]], params, use_tqdm=False)
    assert batch[1].outputs[0].token_ids == alone.token_ids
    assert batch[1].outputs[0].text == alone.text
    assert batch[1].outputs[0].logprobs == alone.logprobs
    assert batch[2].outputs[0].token_ids != alone.token_ids  # another seed draws another text


def test_n_samples_share_the_prompt_copy_on_write(smol_base: LLM) -> None:
    llm = smol_base.reconfigured()
    prompt = list(range(1000, 1000 + 45))  # 2 full blocks + 13 tokens: the partial block is shared, then copied
    params = replace(SEEDED, n=4, max_tokens=8)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 8 for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    # Each child's first write lands in the shared partial block: one copy per child.
    assert llm.engine.core.runner.num_block_copies >= 3
    assert llm.engine.core.scheduler.kv.pool.num_free_blocks == llm.engine.core.scheduler.kv.pool.num_usable_blocks
    # The same seeded request again gives the same n texts.
    again = llm.generate([prompt], params, use_tqdm=False)[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]


def test_stop_strings_cut_the_text(smol_base: LLM) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=40)
    prompt = smol_base.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    full = smol_base.generate([prompt], greedy, use_tqdm=False)[0].outputs[0]
    assert "Paris" in full.text
    cut = smol_base.generate([prompt], replace(greedy, stop=["Paris"]), use_tqdm=False)[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == "Paris"
    assert cut.text == full.text[: full.text.index("Paris")]
    kept = smol_base.generate([prompt], replace(greedy, stop="Paris", include_stop_str_in_output=True), use_tqdm=False)
    assert kept[0].outputs[0].text.endswith("Paris")


def test_stop_token_ids_and_eos(smol_base: LLM) -> None:
    prompt = smol_base.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    out = smol_base.generate([prompt], SamplingParams(temperature=0, max_tokens=60), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == 2  # <|im_end|>
    stop_at = out.token_ids[2]
    cut = smol_base.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=60, stop_token_ids=[stop_at]), use_tqdm=False
    )[0].outputs[0]
    assert cut.token_ids == out.token_ids[:3] and cut.stop_reason == stop_at


def test_logprobs_match_the_model_distribution(smol_base: LLM) -> None:
    prompt = [1, 504, 3575, 282, 4649, 314]
    out = smol_base.generate([prompt], SamplingParams(temperature=0, max_tokens=3, logprobs=3), use_tqdm=False)[0]
    lps = out.outputs[0].logprobs
    assert lps is not None and len(lps) == 3
    first = lps[0]
    model = smol_base.engine.loaded.model
    with attention(model, "sdpa"), torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[0, -1]
    want = torch.log_softmax(logits.float(), -1)
    top = torch.topk(want, 3).indices.tolist()
    assert set(top) <= set(first)
    for tok, value in first.items():
        assert abs(value - want[tok].item()) < 1e-3


def test_metrics_count_cached_prompt_tokens(smol_base: LLM) -> None:
    llm = smol_base.reconfigured()
    prompt = list(range(2000, 2000 + 70))
    params = SamplingParams(temperature=0, max_tokens=2)
    first = llm.generate([prompt], params, use_tqdm=False)[0]
    second = llm.generate([prompt], params, use_tqdm=False)[0]
    assert first.metrics.num_cached_tokens == 0
    assert second.metrics.num_cached_tokens == 64
    assert second.metrics.time_to_first_token is not None and second.metrics.num_generated_tokens == 2
    # A request that ends on its first token still reports its hit.
    one = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)[0]
    assert one.metrics.num_cached_tokens == 64
