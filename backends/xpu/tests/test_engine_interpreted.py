"""The engine end to end on the ``xpu`` backend: Intel's tiles in the Triton interpreter, greedy output token for
token against transformers' own ``generate``.

The engine runs in a child process, since Triton fixes interpreter vs compiled mode when it is first imported;
the child sets only ``PAGED_XPU_INTERPRET=1``, so this also checks that the switch acts before the engine (through
transformers) imports triton.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, os, sys
from paged_core import LLM, SamplingParams

path, prompts = sys.argv[1], json.loads(sys.argv[2])
llm = LLM(path, backend="xpu", device="cpu", dtype="float32", kv_cache_memory="8MiB", block_size=16)
params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
print(json.dumps({"got": got, "tiles": os.environ.get("PAGED_TRITON_INTERPRET_TILES")}))
"""


def _transformers_greedy(path: Path, prompts: list[list[int]]) -> list[list[int]]:
    """A seeded random Llama saved to ``path``, and its own greedy continuations (12 tokens)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=256,
        initializer_range=0.3,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    want = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=12,
                min_new_tokens=12,
                do_sample=False,
                pad_token_id=0,
            )
            want.append(out[0, len(p) :].tolist())
    return want


def test_greedy_output_matches_transformers_with_intel_tiles(tmp_path: Path) -> None:
    """Three prompts (one past a block edge, one prefix-sharing), 12 greedy tokens each, all identical."""
    prompts = [[1, *range(3, 40)], [1, 7, 9], [1, *range(3, 20), 99, 98]]
    want = _transformers_greedy(tmp_path / "tiny", prompts)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PAGED_TRITON_INTERPRET_TILES")}
    env.update(PAGED_XPU_INTERPRET="1", PAGED_RUNTIME="0", TRANSFORMERS_VERBOSITY="error")
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "tiny"), json.dumps(prompts)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["tiles"] == "xpu", "the interpreter did not launch Intel's tiles"
    assert result["got"] == want
