"""``paged bench serve`` figures from made-up chunk timelines: TTFT, ITL, TPOT, token counts, summaries, ratios."""

from __future__ import annotations

import pytest

from paged_bench.serve_stats import Timeline, ratios, run_figures, summarize


def timeline(start: float, chunks: list[tuple[float, str]], end: float, usage: int | None = None) -> Timeline:
    tl = Timeline(start=start, end=end, usage_tokens=usage, prompt_tokens=10)
    for at, text in chunks:
        tl.add_chunk(at, text)
    return tl


def test_ttft_waits_for_the_first_chunk_with_text() -> None:
    # A held-back chunk (empty text: half a UTF-8 character) carries a token but no text yet.
    tl = timeline(1.0, [(1.5, ""), (2.0, "He"), (2.25, "llo"), (2.75, "!")], end=2.8)
    assert tl.ttft == pytest.approx(1.0)
    assert tl.itl() == pytest.approx([0.25, 0.5])


def test_itl_counts_empty_chunks_after_the_first_text() -> None:
    tl = timeline(0.0, [(0.5, "a"), (0.75, ""), (1.25, "b")], end=1.3)
    assert tl.itl() == pytest.approx([0.25, 0.5])


def test_a_stream_without_text_has_no_ttft_or_itl() -> None:
    tl = timeline(0.0, [(0.5, ""), (0.6, "")], end=0.7)
    assert tl.ttft is None and tl.itl() == [] and tl.tpot() is None


def test_tokens_come_from_usage_else_from_chunks() -> None:
    chunks = [(0.5, "a"), (1.0, "bc"), (1.5, "d")]
    assert timeline(0.0, chunks, 1.5, usage=4).output_tokens == 4  # the server coalesced two tokens into one chunk
    assert timeline(0.0, chunks, 1.5).output_tokens == 3


def test_tpot_spreads_the_decode_time_over_the_tokens_after_the_first() -> None:
    tl = timeline(0.0, [(1.0, "a"), (2.0, "bc")], end=2.0, usage=5)
    assert tl.tpot() == pytest.approx(1.0 / 4)
    assert timeline(0.0, [(1.0, "a")], end=1.0, usage=1).tpot() is None


def test_summarize_interpolates_percentiles() -> None:
    s = summarize([4.0, 1.0, 3.0, 2.0], keep_values=True)
    assert s is not None
    assert (s["p50"], s["min"], s["max"], s["mean"], s["count"]) == (2.5, 1.0, 4.0, 2.5, 4)
    assert s["p99"] == pytest.approx(3.97)
    assert s["p90"] == pytest.approx(3.7)
    assert s["values"] == [4.0, 1.0, 3.0, 2.0]  # request order, not sorted
    assert "values" not in summarize([1.0])  # type: ignore[operator]
    assert summarize([]) is None


def test_run_figures_aggregates_and_keeps_failures_apart() -> None:
    ok1 = timeline(0.0, [(1.0, "a"), (1.5, "b"), (2.5, "c")], end=2.5, usage=3)
    ok2 = timeline(0.5, [(1.0, "x"), (2.0, "y")], end=2.0, usage=2)
    bad = Timeline(start=0.0, end=0.1, error="APIConnectionError: refused")
    r = run_figures("mp", [ok1, ok2, bad], seconds=2.5, expected_tokens=8)
    assert (r["num_requests"], r["completed"], r["failed"]) == (3, 2, 1)
    assert r["errors"] == ["APIConnectionError: refused"]
    assert r["output_tokens"] == 5 and r["expected_output_tokens"] == 8
    assert r["token_count_source"] == "usage"
    assert r["output_tok_s"] == pytest.approx(2.0)
    assert r["total_tok_s"] == pytest.approx((20 + 5) / 2.5)
    assert r["ttft_s"]["values"] == pytest.approx([1.0, 0.5])
    assert r["itl_s"]["count"] == 3  # gaps 0.5 and 1.0, then 1.0
    assert r["itl_s"]["p50"] == pytest.approx(1.0) and r["itl_s"]["min"] == pytest.approx(0.5)
    assert r["latency_s"]["max"] == pytest.approx(2.5)


def test_run_figures_says_when_tokens_were_counted_from_chunks() -> None:
    tl = timeline(0.0, [(1.0, "a"), (2.0, "b")], end=2.0)
    assert run_figures("x", [tl], 2.0, 2)["token_count_source"] == "chunks"
    with pytest.raises(ValueError, match="> 0 seconds"):
        run_figures("x", [tl], 0.0, 2)


def test_ratios_are_each_variant_over_the_first() -> None:
    def run(name: str, tok_s: float, ttft: float, itl: float | None) -> dict[str, object]:
        summary = None if itl is None else {"p50": itl, "p99": 2 * itl}
        return {"name": name, "output_tok_s": tok_s, "ttft_s": {"p50": ttft, "p99": 2 * ttft}, "itl_s": summary}

    out = ratios([run("mp", 100.0, 0.2, 0.01), run("inproc", 80.0, 0.1, None)])
    assert out == pytest.approx(
        {"inproc_vs_mp_output_tok_s": 0.8, "inproc_vs_mp_ttft_p50": 0.5, "inproc_vs_mp_ttft_p99": 0.5}
    )
    assert ratios([run("mp", 1.0, 1.0, 1.0)]) == {}
