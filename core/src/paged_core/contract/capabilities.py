"""What a backend declares it can do, and the check that refuses everything else."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from paged_core.errors import UnsupportedConfigError


class GraphSupport(enum.IntEnum):
    """How much of a batch a backend's attention can run inside a captured graph."""

    NEVER = 0
    """Always eager."""
    UNIFORM_DECODE = 1
    """Batches where every row has query length 1 (pure decode)."""
    ANY = 2
    """Any batch, padded to a captured token count."""


@dataclass(frozen=True)
class AttentionSpec:
    """One attention layer's shape, as the model defines it.

    ``sliding_window`` counts the keys a query sees including itself: key
    position ``j`` is visible from query position ``i`` iff
    ``i - sliding_window < j <= i``. ``logits_soft_cap`` ``c`` maps each score
    ``s`` to ``c * tanh(s / c)`` before masking and softmax.
    """

    num_heads: int
    num_kv_heads: int
    head_size: int
    scale: float | None = None
    """Multiplier of ``q . k`` before soft cap and softmax; ``None`` means ``head_size ** -0.5``.
    Backends must honour an explicit value (several model families set their own)."""
    sliding_window: int | None = None
    logits_soft_cap: float | None = None

    def __post_init__(self) -> None:
        if self.num_heads <= 0 or self.num_kv_heads <= 0 or self.head_size <= 0:
            raise UnsupportedConfigError(
                f"num_heads, num_kv_heads and head_size must be positive, got "
                f"{self.num_heads}, {self.num_kv_heads}, {self.head_size}"
            )
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedConfigError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise UnsupportedConfigError(f"sliding_window must be positive or None, got {self.sliding_window}")
        if self.logits_soft_cap is not None and self.logits_soft_cap <= 0:
            raise UnsupportedConfigError(f"logits_soft_cap must be positive or None, got {self.logits_soft_cap}")

    @property
    def gqa_ratio(self) -> int:
        """Query heads per KV head."""
        return self.num_heads // self.num_kv_heads

    @property
    def softmax_scale(self) -> float:
        """``scale`` or, when unset, ``head_size ** -0.5``."""
        return self.scale if self.scale is not None else self.head_size**-0.5


def _names(values: frozenset[torch.dtype]) -> str:
    return ", ".join(sorted(str(v).removeprefix("torch.") for v in values))


@dataclass(frozen=True)
class BackendCapabilities:
    """The backend's declared envelope; the conformance suite tests exactly this.

    ``None`` for ``head_sizes`` or ``gqa_ratios`` means "any". ``block_sizes``
    is explicit (its first entry is the backend's preferred size) because the
    suite tests every declared one.
    """

    dtypes: frozenset[torch.dtype]
    block_sizes: tuple[int, ...]
    kv_cache_dtypes: frozenset[torch.dtype] | None = None
    head_sizes: frozenset[int] | None = None
    gqa_ratios: frozenset[int] | None = None
    sliding_window: bool = False
    logits_soft_cap: bool = False
    graph_support: GraphSupport = GraphSupport.NEVER
    extra: dict[str, object] = field(default_factory=dict, compare=False)
    batch_invariant: bool = False
    """The attention gives each query row the same output bits whatever else is in the batch: other rows
    (how many, which), the row's position in the batch, and whether the row is one of a prefill chunk (of
    any size, after cached context or not), a speculative verify row or a decode row at the same position
    over the same keys. So every output is reduced in an order fixed by the row's own shapes (its key
    count, the layer's sizes), never by the batch: a long key range is split at fixed sizes, and a chunk
    and a decode row sum alike. The conformance suite checks it bit for bit when declared; the engine
    reports a configuration invariant only on a backend that declares it (see also
    :attr:`FusedOps.batch_invariant_linear <paged_core.contract.fused_ops.FusedOps.batch_invariant_linear>`
    and :attr:`FusedOps.batch_invariant_layer_ops
    <paged_core.contract.fused_ops.FusedOps.batch_invariant_layer_ops>`)."""

    def __post_init__(self) -> None:
        # Declarations come from third-party code: normalise types here so that a
        # plain int or a list is either accepted as meant or refused by name.
        def dtype_set(field_name: str, values: object) -> frozenset[torch.dtype]:
            if not isinstance(values, (set, frozenset, list, tuple)) or not all(
                isinstance(v, torch.dtype) for v in values
            ):
                raise UnsupportedConfigError(f"{field_name} must be a set of torch.dtype, got {values!r}")
            return frozenset(values)

        def int_set(field_name: str, values: object) -> frozenset[int]:
            if not isinstance(values, (set, frozenset, list, tuple)) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values
            ):
                raise UnsupportedConfigError(f"{field_name} must be a set of positive ints or None, got {values!r}")
            return frozenset(values)

        set_ = object.__setattr__
        set_(self, "dtypes", dtype_set("dtypes", self.dtypes))
        if not self.dtypes:
            raise UnsupportedConfigError("a backend must declare at least one dtype")
        if self.kv_cache_dtypes is not None:
            set_(self, "kv_cache_dtypes", dtype_set("kv_cache_dtypes", self.kv_cache_dtypes))
        if not isinstance(self.block_sizes, (list, tuple)) or not self.block_sizes:
            raise UnsupportedConfigError(f"block_sizes must be a non-empty sequence of ints, got {self.block_sizes!r}")
        int_set("block_sizes", self.block_sizes)
        set_(self, "block_sizes", tuple(self.block_sizes))
        if self.head_sizes is not None:
            set_(self, "head_sizes", int_set("head_sizes", self.head_sizes))
        if self.gqa_ratios is not None:
            set_(self, "gqa_ratios", int_set("gqa_ratios", self.gqa_ratios))
        if not isinstance(self.batch_invariant, bool):
            raise UnsupportedConfigError(f"batch_invariant must be True or False, got {self.batch_invariant!r}")
        try:
            set_(self, "graph_support", GraphSupport(self.graph_support))
        except ValueError:
            allowed = ", ".join(f"{g.name} ({g.value})" for g in GraphSupport)
            raise UnsupportedConfigError(
                f"graph_support must be a GraphSupport ({allowed}), got {self.graph_support!r}"
            ) from None

    @property
    def effective_kv_cache_dtypes(self) -> frozenset[torch.dtype]:
        """KV-cache dtypes; when undeclared, the same as ``dtypes``."""
        return self.kv_cache_dtypes if self.kv_cache_dtypes is not None else self.dtypes

    @property
    def default_block_size(self) -> int:
        return self.block_sizes[0]

    def check(
        self,
        spec: AttentionSpec,
        dtype: torch.dtype,
        block_size: int,
        kv_cache_dtype: torch.dtype | None = None,
    ) -> None:
        """Raise :class:`UnsupportedConfigError` naming the supported values if anything is outside the envelope."""
        problems: list[str] = []
        if dtype not in self.dtypes:
            problems.append(f"dtype {dtype} not supported (supported: {_names(self.dtypes)})")
        kv = kv_cache_dtype if kv_cache_dtype is not None else dtype
        if kv not in self.effective_kv_cache_dtypes:
            problems.append(f"kv_cache_dtype {kv} not supported (supported: {_names(self.effective_kv_cache_dtypes)})")
        if self.head_sizes is not None and spec.head_size not in self.head_sizes:
            problems.append(f"head_size {spec.head_size} not supported (supported: {sorted(self.head_sizes)})")
        if block_size not in self.block_sizes:
            problems.append(f"block_size {block_size} not supported (supported: {list(self.block_sizes)})")
        if self.gqa_ratios is not None and spec.gqa_ratio not in self.gqa_ratios:
            problems.append(f"GQA ratio {spec.gqa_ratio} not supported (supported: {sorted(self.gqa_ratios)})")
        if spec.sliding_window is not None and not self.sliding_window:
            problems.append("sliding window not supported")
        if spec.logits_soft_cap is not None and not self.logits_soft_cap:
            problems.append("logits soft cap not supported")
        if problems:
            raise UnsupportedConfigError("; ".join(problems))

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready view (used by ``paged backends --json`` and conformance reports)."""
        return {
            "dtypes": sorted(str(d).removeprefix("torch.") for d in self.dtypes),
            "kv_cache_dtypes": sorted(str(d).removeprefix("torch.") for d in self.effective_kv_cache_dtypes),
            "head_sizes": sorted(self.head_sizes) if self.head_sizes is not None else "any",
            "block_sizes": list(self.block_sizes),
            "gqa_ratios": sorted(self.gqa_ratios) if self.gqa_ratios is not None else "any",
            "sliding_window": self.sliding_window,
            "logits_soft_cap": self.logits_soft_cap,
            "graph_support": self.graph_support.name.lower(),
            "batch_invariant": self.batch_invariant,
        }
