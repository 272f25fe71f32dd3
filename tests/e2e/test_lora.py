"""Multi-LoRA end to end: greedy output equals transformers + PEFT token for token (fp32), for one batch mixing
the base model and three adapters of different ranks, scalings and target modules, on two architectures, under
chunked prefill, preemption, adapter swaps (fewer slots than adapters) and prefix-cache hits; requests of
different adapters never share a prefix block; bad adapters are refused by name and hurt no other request."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from paged_core import LLM, LoRARequest, RequestRejectedError

from .e2e_helpers import GREEDY, assert_same_tokens
from .lora_helpers import peft_greedy, save_adapter
from .tiny_models import VOCAB, save_tiny_model

PARAMS = dataclasses.replace(GREEDY, max_tokens=12)
ADAPTERS: dict[str, dict[str, Any]] = {
    "attn-r4": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
    "all-r8-rslora": {
        "r": 8,
        "lora_alpha": 16,
        "use_rslora": True,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    },
    "mlp-r16": {"r": 16, "lora_alpha": 32, "target_modules": ["gate_proj", "down_proj", "up_proj"]},
}


_SETUPS: dict[str, Any] = {}


@pytest.fixture(scope="module", params=["qwen3", "mistral"])
def setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Per architecture: the model, three adapters, 12 prompts cycling base/adapters, PEFT's answers."""
    arch = request.param
    if arch not in _SETUPS:
        root = Path(tmp_path_factory.mktemp(f"lora-{arch}"))
        base = save_tiny_model(arch, root)
        loras = [
            LoRARequest(name, i + 1, str(save_adapter(base, name, spec, root, seed=i)))
            for i, (name, spec) in enumerate(ADAPTERS.items())
        ]
        rng = random.Random(4)
        prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 60))] for _ in range(12)]
        assigned: list[LoRARequest | None] = [([None, *loras])[i % 4] for i in range(len(prompts))]
        want: list[list[int]] = [[] for _ in prompts]
        for lora in [None, *loras]:
            idx = [i for i, a in enumerate(assigned) if a is lora]
            path = Path(lora.path) if lora is not None else None
            for i, out in zip(idx, peft_greedy(base, path, [prompts[i] for i in idx], PARAMS.max_tokens), strict=True):
                want[i] = out
        llm = LLM(str(base), backend="reference", dtype="float32", kv_cache_memory="8MiB", enable_lora=True)
        _SETUPS[arch] = {
            "base": base,
            "loras": loras,
            "prompts": prompts,
            "assigned": assigned,
            "want": want,
            "llm": llm,
        }
    return _SETUPS[arch]  # type: ignore[no-any-return]


def test_adapters_change_the_output(setup: dict[str, Any]) -> None:
    # Otherwise equality below would prove nothing about the adapters.
    want, assigned = setup["want"], setup["assigned"]
    base_only = peft_greedy(setup["base"], None, setup["prompts"], PARAMS.max_tokens)
    changed = [i for i, a in enumerate(assigned) if a is not None and want[i] != base_only[i]]
    assert len(changed) >= 6, changed


@pytest.mark.parametrize(
    "case", ["together", "two-slots", "chunked-prefill", "preemption", "prefix-hits", "speculative", "n2"]
)
def test_mixed_batch_matches_peft(setup: dict[str, Any], case: str) -> None:
    changes: dict[str, Any] = {}
    if case == "two-slots":  # three adapters, two slots: the scheduler holds one back, slots swap
        changes = {"max_loras": 2}
    if case == "chunked-prefill":
        changes = {"max_num_batched_tokens": 24, "max_num_seqs": 5}
    if case == "preemption":
        changes = {"kv_cache_memory": 2 * 2 * 2 * 64 * 4 * 16 * 12}
    if case == "speculative":  # verify rows run on their request's adapter
        changes = {"speculative": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    params = dataclasses.replace(PARAMS, n=2) if case == "n2" else PARAMS  # forks keep the adapter
    llm = setup["llm"].reconfigured(**changes)
    outs = llm.generate(setup["prompts"], params, use_tqdm=False, lora_request=setup["assigned"])
    if case == "prefix-hits":  # the same batch again: every request hits its own adapter's blocks
        outs = llm.generate(setup["prompts"], params, use_tqdm=False, lora_request=setup["assigned"])
        assert sum(o.metrics.num_cached_tokens > 0 for o in outs) >= 8, [o.metrics.num_cached_tokens for o in outs]
    assert_same_tokens(outs, setup["want"])
    if case == "n2":
        assert all(o.outputs[1].token_ids == o.outputs[0].token_ids for o in outs)
    if case == "speculative":
        assert llm.engine.core.spec_stats.draft_tokens > 0
    slots = llm.engine.core.runner.lora
    assert slots is not None
    if case == "two-slots":
        assert slots.loads > 2, slots.loads  # an adapter was swapped out and another in
    if case == "preemption":
        assert llm.engine.core.scheduler.num_preemptions > 0


def test_prefix_blocks_are_never_shared_across_adapters(setup: dict[str, Any]) -> None:
    llm = setup["llm"].reconfigured()
    prompt = setup["prompts"][0] * 3  # several full blocks
    a, b = setup["loras"][0], setup["loras"][1]

    def cached(lora: LoRARequest | None) -> int:
        out = llm.generate([prompt], PARAMS, use_tqdm=False, lora_request=lora)[0]
        assert out.error is None, out.error
        return out.metrics.num_cached_tokens

    assert cached(a) == 0
    assert cached(b) == 0  # same prompt, another adapter: no block of a's
    assert cached(None) == 0  # nor the base model's
    assert cached(a) > 0 and cached(b) > 0  # each hits its own


def _broken(root: Path, good: LoRARequest, what: str) -> LoRARequest:
    """A copy of ``good`` damaged as ``what`` says."""
    import shutil

    path = root / f"broken-{what}"
    shutil.copytree(good.path, path)
    config = json.loads((path / "adapter_config.json").read_text())
    if what == "rank":
        config["r"] = 64
        from safetensors.torch import load_file, save_file

        tensors = load_file(path / "adapter_model.safetensors")
        tensors = {k: torch.cat([v] * 8, dim=0 if "lora_A" in k else 1) for k, v in tensors.items()}
        save_file(tensors, path / "adapter_model.safetensors")
    if what == "config":
        (path / "adapter_config.json").write_text("{not json")
        return LoRARequest(what, 90, str(path))
    if what == "missing":
        return LoRARequest(what, 91, str(root / "nowhere"))
    if what == "shape":
        from safetensors.torch import load_file, save_file

        tensors = load_file(path / "adapter_model.safetensors")
        tensors = {k: v[:, :-1].contiguous() if "lora_A" in k else v for k, v in tensors.items()}
        save_file(tensors, path / "adapter_model.safetensors")
    (path / "adapter_config.json").write_text(json.dumps(config))
    return LoRARequest(what, 92 + ["rank", "shape"].index(what), str(path))


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("missing", "no such directory"),
        ("config", "adapter_config.json is not JSON"),
        ("rank", "above max_lora_rank=16"),
        ("shape", "another base model"),
    ],
)
def test_a_bad_adapter_fails_its_request_alone(setup: dict[str, Any], what: str, message: str, tmp_path: Path) -> None:
    bad = _broken(tmp_path, setup["loras"][0], what)
    llm = setup["llm"]
    loras = [bad, *setup["assigned"][1:4]]
    outs = llm.generate(setup["prompts"][:4], PARAMS, use_tqdm=False, lora_request=loras)
    assert outs[0].error is not None and repr(what) in outs[0].error and message in outs[0].error, outs[0].error
    assert_same_tokens(outs[1:], setup["want"][1:4])


def test_lora_is_refused_without_enable_lora_and_where_it_cannot_run(setup: dict[str, Any]) -> None:
    from paged_core.api import UnsupportedConfigError

    plain = LLM(str(setup["base"]), backend="reference", dtype="float32", kv_cache_memory="8MiB")
    with pytest.raises(RequestRejectedError, match="'attn-r4' requested, but the engine runs without enable_lora"):
        plain.generate([setup["prompts"][0]], PARAMS, use_tqdm=False, lora_request=setup["loras"][0])
    with pytest.raises(UnsupportedConfigError, match="enable_lora needs the fused decoder"):
        setup["llm"].reconfigured(model_impl="transformers")
    with pytest.raises(UnsupportedConfigError, match="enable_lora runs eagerly for now"):
        setup["llm"].reconfigured(graph_mode="compiled")
