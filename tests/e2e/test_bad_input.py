"""Bad input gets a clear error naming what is wrong; in a batch, a bad request is refused alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from paged_core import LLM, RequestRejectedError, SamplingParams
from paged_core.api import BackendNotFoundError, ConfigError, UnsupportedConfigError
from paged_core.loading.loader import embedded_model_path

from .tiny_models import save_tiny_model


def test_empty_prompt(smol_base: LLM) -> None:
    with pytest.raises(RequestRejectedError, match="prompt is empty"):
        smol_base.generate("", use_tqdm=False)
    with pytest.raises(RequestRejectedError, match="prompt is empty"):
        smol_base.generate([[]], use_tqdm=False)


def test_prompt_longer_than_max_model_len(smol_base: LLM) -> None:
    short = smol_base.reconfigured(max_model_len=64)
    with pytest.raises(RequestRejectedError, match="64"):
        short.generate([list(range(100, 200))], use_tqdm=False)


def test_token_ids_outside_the_vocabulary(smol_base: LLM) -> None:
    with pytest.raises(RequestRejectedError, match=r"token ids must be in \[0, 49152\)"):
        smol_base.generate([[1, 2, 10**6]], use_tqdm=False)


@pytest.mark.parametrize(
    ("field", "value", "accepted"),
    [
        ("max_tokens", 0, ">= 1"),
        ("temperature", -0.5, ">= 0"),
        ("top_p", 0.0, r"\(0, 1\]"),
        ("top_p", 1.5, r"\(0, 1\]"),
        ("n", 0, ">= 1"),
    ],
)
def test_sampling_params_name_the_field(field: str, value: object, accepted: str) -> None:
    with pytest.raises(RequestRejectedError, match=rf"SamplingParams\.{field} must be .*{accepted}.*got"):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_unknown_model_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        LLM(str(tmp_path / "nowhere"))


def test_truncated_gguf_is_named(tmp_path: Path) -> None:
    data = embedded_model_path().read_bytes()
    f = tmp_path / "SmolLM2-cut.gguf"
    f.write_bytes(data[: len(data) // 3])
    with pytest.raises(ConfigError, match=r"SmolLM2-cut\.gguf"):
        LLM(str(f))


def test_unknown_backend() -> None:
    with pytest.raises(BackendNotFoundError, match="known backends"):
        LLM(backend="no-such-backend")


def test_backend_that_cannot_serve_the_head_size(tmp_path: Path) -> None:
    # The example backend declares head sizes 64, 80, 128 and 256 and no soft cap: Gemma2's soft cap is refused.
    path = save_tiny_model("gemma2", tmp_path)
    with pytest.raises(UnsupportedConfigError, match=r"backend 'example' cannot serve this model: .*soft cap"):
        LLM(str(path), backend="example", dtype="float32", kv_cache_memory="4MiB")


def test_backend_that_cannot_serve_the_dtype() -> None:
    with pytest.raises(UnsupportedConfigError, match=r"dtype torch\.float16 not supported \(supported: .*float32"):
        LLM(backend="example", dtype="float16", kv_cache_memory="4MiB")


def test_one_bad_request_in_a_batch_is_refused_alone(smol_base: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=4)
    outs = smol_base.generate(["Hello", "", [1, 10**7], "The sky is"], params, use_tqdm=False)
    assert [o.error is None for o in outs] == [True, False, False, True]
    assert "prompt 1: prompt is empty" in (outs[1].error or "")
    assert "token ids" in (outs[2].error or "")
    assert all(len(o.outputs[0].token_ids) == 4 for o in (outs[0], outs[3]))
