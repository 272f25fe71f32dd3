"""Multi-LoRA serving: PEFT adapters over the base model, several in one batch.

An adapter (:class:`LoRARequest`: a name, an id and a PEFT checkpoint directory) is loaded and checked
against the base model when a request first names it (:mod:`.adapter`), kept on the host, and copied into
one of ``max_loras`` device slots of stacked A and B matrices when a step needs it, the least recently used
slot giving way (:mod:`.slots`). The fused decoder adds each token's adapter to its projections through the
backend's ``lora_shrink``/``lora_expand`` pair (:class:`~paged_core.contract.fused_ops.FusedOps`).
"""

from paged_core.lora.adapter import LoRAAdapter, LoRAError, load_adapter
from paged_core.lora.request import LoRARequest
from paged_core.lora.slots import LoRASlots

__all__ = ["LoRAAdapter", "LoRAError", "LoRARequest", "LoRASlots", "load_adapter"]
