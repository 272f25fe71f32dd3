"""OutputProcessor: core deltas become cumulative outputs; stop strings end a sequence here and ask for an abort."""

from __future__ import annotations

from typing import Any

from paged_core.engine_core.messages import CoreOutputs, CoreRequest, SchedulerStats, SeqDelta
from paged_core.frontend.output_processor import OutputProcessor
from paged_core.sampling.params import SamplingParams


class Chars:
    """Token id = code point."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(map(chr, ids))

    def convert_ids_to_tokens(self, token_id: int) -> str:
        return chr(token_id)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    all_special_ids: tuple[int, ...] = ()


def _outputs(*deltas: SeqDelta, **kwargs: Any) -> CoreOutputs:
    return CoreOutputs(list(deltas), SchedulerStats(), **kwargs)


def _req(rid: str, **params: Any) -> CoreRequest:
    return CoreRequest(rid, [ord("x")], SamplingParams(**params), arrival_time=1.0)


def test_deltas_rebuild_text_and_tokens_and_n_is_assembled() -> None:
    proc = OutputProcessor(Chars())
    proc.add(_req("r", n=2, max_tokens=2), "x")
    outs, stopped = proc.process(
        _outputs(SeqDelta("r", 0, [ord("a")], num_cached_tokens=0), SeqDelta("r", 1, [ord("b")]))
    )
    assert not stopped and len(outs) == 1 and not outs[0].finished
    assert [o.text for o in outs[0].outputs] == ["a", "b"] and outs[0].metrics.first_token_time is not None
    outs, _ = proc.process(
        _outputs(
            SeqDelta("r", 0, [ord("c")], finish_reason="length"), SeqDelta("r", 1, [ord("d")], finish_reason="length")
        )
    )
    final = outs[0]
    assert final.finished and [o.token_ids for o in final.outputs] == [[97, 99], [98, 100]]
    assert [o.new_text for o in final.outputs] == ["c", "d"] and "r" not in proc


def test_a_stop_string_finishes_the_sequence_here_and_names_it_for_an_abort() -> None:
    proc = OutputProcessor(Chars())
    proc.add(_req("r", stop=["cd"], max_tokens=50))
    outs, stopped = proc.process(_outputs(SeqDelta("r", 0, [ord(c) for c in "abcde"])))
    assert stopped == [("r", 0)]
    out = outs[0].outputs[0]
    assert outs[0].finished and out.text == "ab" and out.finish_reason == "stop" and out.stop_reason == "cd"
    # The core had run one more step before it heard: those tokens are dropped, nothing shows past the stop.
    outs, stopped = proc.process(_outputs(SeqDelta("r", 0, [ord("f")])))
    assert outs == [] and stopped == []


def test_an_error_delta_fails_the_request_alone() -> None:
    proc = OutputProcessor(Chars())
    proc.add(_req("bad"))
    proc.add(_req("good", max_tokens=1))
    outs, _ = proc.process(
        _outputs(
            SeqDelta("bad", 0, [], finish_reason="abort", error="sampling failed"),
            SeqDelta("good", 0, [ord("k")], finish_reason="length"),
            failed={"bad": "sampling failed"},
        )
    )
    by_id = {o.request_id: o for o in outs}
    assert by_id["bad"].error == "sampling failed" and by_id["bad"].outputs == [] and by_id["bad"].finished
    assert by_id["good"].error is None and by_id["good"].outputs[0].text == "k"
    assert len(proc) == 0


def test_deltas_of_removed_requests_are_ignored() -> None:
    proc = OutputProcessor(Chars())
    proc.add(_req("r"))
    proc.remove(["r"])
    assert proc.process(_outputs(SeqDelta("r", 0, [ord("a")]))) == ([], [])
