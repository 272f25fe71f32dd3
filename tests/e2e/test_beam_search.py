"""Beam search equals transformers' ``generate(num_beams=W, do_sample=False)`` token for token (fp32).

Checked on the embedded SmolLM2 (chat prompts, one that ends on EOS within the budget) and on tiny random
Qwen3 and Mistral models (random prompts; an extra stop token id makes beams end early), for widths 2 and 4,
several length penalties and every ``early_stopping`` mode, also under preemption. The beams share their KV
blocks: a group holds fewer blocks than as many lone requests.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from paged_bench.hf_runs import attention
from paged_core import LLM, SamplingParams
from paged_core.errors import RequestRejectedError
from paged_core.frontend.beam_outputs import BeamSearchOutput

from .tiny_models import VOCAB, save_tiny_model

pytestmark = pytest.mark.usefixtures("exact_activations")  # parity with transformers: exact fp32 activations

MAX_TOKENS = 8


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Any:
    """One torch thread here: these are tiny batches, and on a shared two-core machine a second thread only
    contends (transformers' beam search ran 40x slower with two)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def hf_beams(
    llm: LLM, ids: list[int], width: int, max_new: int, eos: Any = "model", attn: str = "sdpa", **options: Any
) -> tuple[list[list[int]], list[float]]:
    """transformers' beam search on the same weights: each returned beam's generated ids, and its score."""
    model = llm.engine.loaded.model
    x = torch.tensor([ids])
    extra = {} if eos == "model" else {"eos_token_id": eos}
    with attention(model, attn), torch.inference_mode():
        y = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            num_beams=width,
            do_sample=False,
            num_return_sequences=width,
            max_new_tokens=max_new,
            pad_token_id=0,
            return_dict_in_generate=True,
            output_scores=True,
            **extra,
            **options,
        )
    # A beam's length is where its beam indices stop (the padding after an early EOS has none).
    lengths = (y.beam_indices != -1).sum(dim=1).tolist()
    seqs = [y.sequences[i, len(ids) : len(ids) + n].tolist() for i, n in enumerate(lengths)]
    return seqs, y.sequences_scores.tolist()


def assert_same_beams(out: BeamSearchOutput, want: tuple[list[list[int]], list[float]]) -> None:
    assert out.error is None, out.error
    seqs, scores = want
    assert [s.token_ids for s in out.sequences] == seqs
    assert [s.score for s in out.sequences] == pytest.approx(scores, rel=1e-4, abs=1e-5)


# ---- the embedded model ---------------------------------------------------------
@pytest.fixture(scope="module")
def smol_prompts(smol_base: LLM) -> list[list[int]]:
    questions = ["What is 2+2? Reply with the number only.", "Name a color."]
    return [smol_base.apply_chat_template([{"role": "user", "content": q}]) for q in questions]


@pytest.mark.parametrize("width", [2, 4])
def test_embedded_model_matches_transformers(smol_base: LLM, smol_prompts: list[list[int]], width: int) -> None:
    outs = smol_base.beam_search(smol_prompts, width, max_tokens=MAX_TOKENS, use_tqdm=False)
    for ids, out in zip(smol_prompts, outs, strict=True):
        assert_same_beams(out, hf_beams(smol_base, ids, width, MAX_TOKENS))
    # The short answer ends on EOS (SmolLM2's <|im_end|>) inside the budget: an EOS-finished beam is compared too.
    best = outs[0].sequences[0]
    assert best.finish_reason == "stop" and best.token_ids[-1] in smol_base.engine.loaded.eos_token_ids
    assert "4" in best.text


# ---- tiny models of other architectures ----------------------------------------
_TINY: dict[str, tuple[LLM, list[list[int]], int]] = {}


def _tiny(arch: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[LLM, list[list[int]], int]:
    """An engine over a tiny random model, three random prompts, and a stop token its beams often meet."""
    if arch not in _TINY:
        llm = LLM(
            str(save_tiny_model(arch, Path(tmp_path_factory.mktemp("beam-models")))),
            dtype="float32",
            kv_cache_memory="8MiB",
        )
        rng = random.Random(2)
        prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 60))] for _ in range(3)]
        greedy = (
            llm.generate(prompts[0], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), use_tqdm=False)[0]
            .outputs[0]
            .token_ids
        )
        _TINY[arch] = (llm, prompts, greedy[2])
    return _TINY[arch]


@pytest.fixture(scope="module", params=["qwen3", "mistral"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[LLM, list[list[int]], int]:
    return _tiny(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> tuple[LLM, list[list[int]], int]:
    """The tiny Qwen3 alone, for the checks that need one architecture only."""
    return _tiny("qwen3", tmp_path_factory)


CASES = [
    (2, {"length_penalty": 1.0}),
    (4, {"length_penalty": 1.0}),
    (4, {"length_penalty": 2.0, "early_stopping": "never"}),
    (2, {"length_penalty": 0.0, "early_stopping": True}),
    (4, {"length_penalty": -0.5}),
]


@pytest.mark.parametrize(("width", "options"), CASES)
def test_tiny_model_matches_transformers(
    tiny: tuple[LLM, list[list[int]], int], width: int, options: dict[str, Any]
) -> None:
    llm, prompts, stop = tiny
    eos = [*llm.engine.loaded.eos_token_ids, stop]
    outs = llm.beam_search(prompts, width, max_tokens=MAX_TOKENS, stop_token_ids=[stop], use_tqdm=False, **options)
    for ids, out in zip(prompts, outs, strict=True):
        assert_same_beams(out, hf_beams(llm, ids, width, MAX_TOKENS, eos=eos, attn="eager", **options))
    if options["length_penalty"] <= 0.0:  # with no (or a negative) length penalty, short beams that stop win
        assert any(s.finish_reason == "stop" for out in outs for s in out.sequences), "no beam met the stop token"


def test_tiny_model_under_preemption_and_chunked_prefill(qwen: tuple[LLM, list[list[int]], int]) -> None:
    llm, prompts, _ = qwen
    per_block = 2 * 2 * 2 * 64 * 4 * 16  # layers x (K, V) x KV heads x head_dim x fp32 x block size
    small = llm.reconfigured(kv_cache_memory=per_block * 12, max_num_batched_tokens=32)
    outs = small.beam_search(prompts, 4, max_tokens=MAX_TOKENS, ignore_eos=True, use_tqdm=False)
    assert small.engine.core.scheduler.num_preemptions > 0
    for ids, out in zip(prompts, outs, strict=True):
        assert_same_beams(out, hf_beams(llm, ids, 4, MAX_TOKENS, eos=None, attn="eager"))


def test_forks_that_find_no_free_row_run_on_their_own(qwen: tuple[LLM, list[list[int]], int]) -> None:
    # Four rows: sampled requests added with the beam group take rows its forks would need.
    llm, prompts, _ = qwen
    small = llm.reconfigured(max_num_seqs=4)
    engine = small.engine
    rid = engine.add_request(
        prompts[1], SamplingParams(n=4, temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True), beam=_beam(4)
    )
    for i in range(3):
        engine.add_request(prompts[i], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert_same_beams(BeamSearchOutput.of(done[rid]), hf_beams(llm, prompts[1], 4, MAX_TOKENS, eos=None, attn="eager"))


def test_beams_beside_speculating_requests(qwen: tuple[LLM, list[list[int]], int]) -> None:
    # n-gram speculation on: the sampled requests speculate, the beams (not the sampler's sequences) never do.
    llm, prompts, _ = qwen
    spec = llm.reconfigured(speculative="ngram", num_speculative_tokens=3)
    engine = spec.engine
    repeat = prompts[0][:8] * 6  # a prompt the n-gram proposer finds drafts in
    others = [
        engine.add_request(repeat, SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)) for _ in range(2)
    ]
    rid = engine.add_request(
        prompts[2], SamplingParams(n=4, temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True), beam=_beam(4)
    )
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert_same_beams(BeamSearchOutput.of(done[rid]), hf_beams(llm, prompts[2], 4, MAX_TOKENS, eos=None, attn="eager"))
    assert all(done[o].error is None for o in others)
    assert engine.stats.spec_verify_rows > 0  # the others did speculate


def _beam(width: int) -> Any:
    from paged_core.engine_core.beam_params import BeamParams

    return BeamParams(width)


# ---- block sharing ----------------------------------------------------------------
def _peak_blocks_in_use(llm: LLM, add: Any) -> int:
    """Most KV blocks in use at once while the requests ``add`` queues run (blocks with a holder only)."""
    engine = llm.engine
    pool = engine.core.scheduler.kv.pool
    add(engine)
    peak = 0
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, sum(1 for b in pool.blocks[1:] if b.ref_cnt > 0))  # blocks[0] is the null block
    return peak


def test_beams_share_their_blocks(qwen: tuple[LLM, list[list[int]], int]) -> None:
    llm, _, _ = qwen
    prompt = list(range(3, 3 + 100))  # 100 tokens: 6 full blocks that every beam shares
    width = 4
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    lone = _peak_blocks_in_use(llm.reconfigured(enable_prefix_caching=False), lambda e: e.add_request(prompt, greedy))
    beams = llm.reconfigured(enable_prefix_caching=False)
    peak = _peak_blocks_in_use(
        beams,
        lambda e: e.add_request(
            prompt, SamplingParams(n=width, temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True), beam=_beam(width)
        ),
    )
    out = beams.beam_search([prompt], width, max_tokens=MAX_TOKENS, ignore_eos=True, use_tqdm=False)[0]
    m = out.metrics
    print(
        f"blocks: beams {peak} (reported {m.peak_blocks}, unshared {m.peak_blocks_unshared}, forks {m.num_forks})"
        f" vs {width} x lone {lone} = {width * lone}"
    )
    assert m.peak_blocks is not None and m.peak_blocks_unshared is not None
    assert peak < width * lone
    assert m.peak_blocks < m.peak_blocks_unshared <= width * lone
    assert m.peak_blocks <= peak and m.num_forks and m.num_forks >= width - 1


# ---- refusals (the rules themselves: core/tests/engine/test_beam_params.py) ---------------
def test_bad_beam_requests_are_refused_naming_the_field(qwen: tuple[LLM, list[list[int]], int]) -> None:
    llm, prompts, _ = qwen
    with pytest.raises(RequestRejectedError, match=r"beam_width must be an int in \[1, 256\]"):
        llm.beam_search(prompts[:1], 0, max_tokens=2, use_tqdm=False)
    with pytest.raises(RequestRejectedError, match="max_num_seqs"):
        llm.beam_search(prompts[:1], 257, max_tokens=2, use_tqdm=False)
    with pytest.raises(RequestRejectedError, match="temperature"):
        llm.engine.add_request(prompts[0], SamplingParams(max_tokens=2, n=2), beam=_beam(2))
    # A core process checks again what comes off its socket, with the same words (an in-process core trusts).
    request = llm.engine.input.process("r", prompts[0], SamplingParams(max_tokens=2, temperature=0.0, n=2))
    from msgspec.structs import replace

    from paged_core.engine_core.wire_checks import check_wire_request

    facts = llm.engine.facts
    with pytest.raises(RequestRejectedError, match="top_p"):
        bad = replace(request, params=SamplingParams(temperature=0.0, top_p=0.5), beam=_beam(2))
        check_wire_request(bad, facts.vocab_size, facts.max_num_seqs)
    assert not llm.engine.core.has_unfinished_requests()
