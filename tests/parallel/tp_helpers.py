"""A tiny random-weight Llama (4 heads, 2 KV heads) for tensor-parallel tests, and the workload they share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import torch

from paged_core import SamplingParams
from paged_core.parallel.leader import WORKER_MODULE


def save_tiny_llama(directory: Path, seed: int = 0) -> Path:
    """Seeded random weights, saved as safetensors (no tokenizer: prompts are token ids)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        initializer_range=0.3,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    out = directory / "tiny-llama"
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    return out


ENGINE: dict[str, Any] = {
    "backend": "reference",
    "dtype": "float32",
    "block_size": 16,
    "num_blocks": 20,
    "max_num_batched_tokens": 64,
    "max_num_seqs": 16,
    "enable_prefix_caching": True,
    "distributed_timeout": 20.0,
}
"""Small enough that 32 prompts preempt (20 blocks), chunk their prefills (64-token budget) and share prefixes."""


def workload() -> tuple[list[list[int]], list[SamplingParams]]:
    """32 prompts in four families sharing a 40-token prefix, every fourth with n=2 (copy-on-write forks)."""
    prompts, params = [], []
    for i in range(32):
        family = i % 4
        prefix = [(37 * family + 11 * j) % 500 + 5 for j in range(40)]
        prompts.append(prefix + [(13 * i + 7 * j) % 500 + 5 for j in range(3 + i % 9)])
        params.append(
            SamplingParams(
                temperature=0.0, max_tokens=12 + i % 5, ignore_eos=True, logprobs=3, n=2 if i % 4 == 3 else 1
            )
        )
    return prompts, params


def worker_pids() -> list[int]:
    """Live tensor-parallel worker processes started from this process (any depth)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if WORKER_MODULE in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child.pid)
        except psutil.Error:
            continue
    return found
