"""Bugs an adversarial review planted that an earlier suite missed: each must now fail in the check that covers it."""

from __future__ import annotations


def failed_nodes(report: dict) -> list[str]:
    """Node ids of every failed or errored test in a report."""
    return [t["nodeid"] for t in report["tests"] if t["outcome"] in ("failed", "error")]


def _messages(report: dict) -> list[str]:
    return [t["message"] for t in report["tests"] if t["outcome"] in ("failed", "error")]


def test_first_layer_memo_fails_on_the_second_layer(run_suite) -> None:
    code, report = run_suite("FirstLayerMemo", "-k", "test_attention and (decode-1 or mixed-block+1)")
    assert code != 0
    messages = _messages(report)
    assert messages and all("layer 1: attention output vs oracle mismatch" in m for m in messages), messages


def test_mutating_metadata_in_place_fails_even_without_graphs(run_suite) -> None:
    code, report = run_suite("MutatesSeqLens", "-k", "test_attention and decode-1")
    assert code != 0
    messages = _messages(report)
    assert messages and all("layer 0: forward modified metadata.seq_lens" in m for m in messages), messages
    assert report["capabilities"]["graph"]["status"] == "n/a"


def test_rows_past_the_fourth_fail_the_wide_batch_only(run_suite) -> None:
    code, report = run_suite("ManyRowsWrong", "-k", "test_attention")
    failed = failed_nodes(report)
    assert code != 0
    assert failed and all("-wide-" in n for n in failed), failed
    statuses = {name: row["status"] for name, row in report["capabilities"].items()}
    assert (statuses["batch:wide"], statuses["batch:mixed"], statuses["batch:long_context"]) == ("fail", "pass", "pass")


def test_split_k_bug_fails_the_long_context_only(run_suite) -> None:
    code, report = run_suite("LongSeqWrong", "-k", "test_attention")
    failed = failed_nodes(report)
    assert code != 0
    assert failed and all("-long_context-" in n for n in failed), failed
    assert report["capabilities"]["batch:long_context"]["status"] == "fail"
    assert report["capabilities"]["batch:wide"]["status"] == "pass"


def test_ignoring_spec_scale_fails_the_scale_cases_only(run_suite) -> None:
    code, report = run_suite("IgnoresSpecScale", "-k", "test_attention and (mixed or scale)")
    failed = failed_nodes(report)
    assert code != 0
    assert failed and all("-scale0.3" in n for n in failed), failed
    assert report["capabilities"]["scale"] == {
        "declared": True,
        "status": "fail",
        "counts": report["capabilities"]["scale"]["counts"],
    }


def test_host_branch_in_the_captured_step_fails_the_trace(run_suite) -> None:
    code, report = run_suite("graph_fakes:HostBranchInGraph", "-k", "graph")
    failed = failed_nodes(report)
    assert code != 0
    assert failed == [n for n in failed if "test_graph_step_has_no_host_reads" in n] and len(failed) == 1, failed
    assert "does not trace as one graph" in _messages(report)[0]
    assert report["capabilities"]["graph"]["status"] == "fail"


def test_host_read_the_compiler_drops_still_fails(run_suite) -> None:
    code, report = run_suite("graph_fakes:HostReadInGraph", "-k", "graph")
    failed = failed_nodes(report)
    assert code != 0 and len(failed) == 1 and "test_graph_step_has_no_host_reads" in failed[0], failed
    assert "reads tensors on the host (tolist)" in _messages(report)[0]
