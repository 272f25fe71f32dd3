"""The suite fails deliberately broken backends, each in the checks that cover its bug and only there."""

from __future__ import annotations


def failed_nodes(report: dict) -> list[str]:
    """Node ids of every failed or errored test in a report."""
    return [t["nodeid"] for t in report["tests"] if t["outcome"] in ("failed", "error")]


def _statuses(report: dict) -> dict[str, str]:
    return {name: row["status"] for name, row in report["capabilities"].items()}


def test_good_fake_passes(run_suite) -> None:
    code, report = run_suite("GoodFake")
    assert code == 0, failed_nodes(report)
    assert report["summary"]["passed"] > 20
    assert failed_nodes(report) == []


def test_wrong_block_indexing_fails_attention(run_suite) -> None:
    code, report = run_suite("WrongBlockIndex")
    failed = failed_nodes(report)
    assert code != 0
    assert any("test_attention[" in n and "-decode-" in n for n in failed), failed
    assert not any("test_kv_cache_shape" in n or "test_refuses_undeclared" in n for n in failed), failed
    assert _statuses(report)["batch:decode"] == "fail"


def test_writing_padding_slots_fails_only_padding(run_suite) -> None:
    code, report = run_suite("WritesPadding")
    failed = failed_nodes(report)
    assert code != 0
    assert failed and all("test_padding_slots_never_written" in n for n in failed), failed
    messages = [t["message"] for t in report["tests"] if t["outcome"] == "failed"]
    assert "padding slots (-1) were written" in messages[0]
    assert _statuses(report)["padding"] == "fail"
    assert _statuses(report)["batch:decode"] == "pass"


def test_off_by_one_causal_mask_fails_prefill_not_decode(run_suite) -> None:
    code, report = run_suite("OffByOneMask", "-k", "test_attention")
    failed = failed_nodes(report)
    assert code != 0
    assert any("-prefill-" in n for n in failed), failed
    assert not any("-decode-" in n for n in failed), "decode rows have no future key to leak"
    statuses = _statuses(report)
    assert (statuses["batch:prefill"], statuses["batch:prefix"], statuses["batch:decode"]) == ("fail", "fail", "pass")


def test_wrong_gqa_mapping_fails_grouped_heads_only(run_suite) -> None:
    code, report = run_suite("WrongGqaMapping", "-k", "test_attention")
    failed = failed_nodes(report)
    assert code != 0
    assert failed and all("-gqa4-" in n for n in failed), failed
    statuses = _statuses(report)
    assert (statuses["gqa:4"], statuses["gqa:1"]) == ("fail", "pass")


def test_stale_graph_metadata_fails_graph_replay(run_suite) -> None:
    code, report = run_suite("graph_fakes:StaleGraph", "-k", "graph")
    failed = failed_nodes(report)
    assert code != 0
    assert failed and all("test_graph_replay_matches_eager" in n for n in failed), failed
    assert _statuses(report)["graph"] == "fail"


def test_declared_capture_without_a_strategy_fails_the_graph_checks(run_suite) -> None:
    code, report = run_suite("graph_fakes:NoStrategyGraph", "-k", "graph")
    failed = failed_nodes(report)
    assert code != 0
    assert any("test_graph_strategy_hook" in n for n in failed), failed
    message = next(t["message"] for t in report["tests"] if "test_graph_strategy_hook" in t["nodeid"])
    assert "declares graph_support=uniform_decode but graph_strategy() returned NoneType" in message, message
    assert _statuses(report)["graph"] == "fail"


def test_good_graph_fake_replays(run_suite) -> None:
    code, report = run_suite("graph_fakes:GoodGraphFake", "-k", "graph")
    assert code == 0, failed_nodes(report)
    assert report["capabilities"]["graph"] == {
        "declared": True,
        "status": "pass",
        "counts": report["capabilities"]["graph"]["counts"],
    }
    assert report["capabilities"]["graph"]["counts"]["passed"] == 6  # strategy hook, trace, 4 batch sizes


def test_declared_capability_disproved(run_suite) -> None:
    code, report = run_suite("ClaimsSlidingWindow", "-k", "sliding or refuses")
    failed = failed_nodes(report)
    assert code != 0
    assert failed and all("test_sliding_window[" in n for n in failed), failed
    row = report["capabilities"]["sliding_window"]
    assert row["declared"] is True and row["status"] == "fail"


def test_undeclared_features_are_not_applicable(run_suite) -> None:
    code, report = run_suite("GoodFake", "-k", "sliding or soft_cap or graph")
    assert code == 0
    for name in ("sliding_window", "soft_cap", "graph"):
        row = report["capabilities"][name]
        assert (row["declared"], row["status"]) == (False, "n/a"), (name, row)
        assert row["counts"]["n/a"] >= 1 and row["counts"]["failed"] == 0
