"""PEFT adapters and transformers + PEFT greedy answers, the oracle of the LoRA tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def save_adapter(base: Path, name: str, spec: dict[str, Any], out: Path, seed: int, scale: float = 0.3) -> Path:
    """A PEFT adapter with random A and B (PEFT starts B at zero, which would change nothing)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(**spec))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, param in peft_model.named_parameters():
            if "lora_" in key:
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
    path = out / name
    peft_model.save_pretrained(path)
    return path


def peft_greedy(base: Path, adapter: Path | None, prompts: list[list[int]], new: int) -> list[list[int]]:
    """transformers' ``generate`` on the base model, through PEFT's adapter when one is given."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="eager")
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(
                input_ids=x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=new,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            outs.append(y[0, len(ids) :].tolist())
    return outs
