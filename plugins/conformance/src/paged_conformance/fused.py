"""Inputs, views and comparisons for the fused layer ops (:class:`paged_core.api.FusedOps`).

The oracle is the reference ``FusedOps()`` itself (the contract names it so).
It always gets contiguous copies of the inputs, taken before the backend's
call, so neither strides nor a backend's in-place edits change what is
expected. Views put NaN in every element of their buffer they do not
cover: a kernel that reads past its view, or ignores its strides, returns
NaN or someone else's numbers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence

import torch

from paged_conformance.grid import LINEAR_FORMATS, ROTARY_BASE, ROTARY_MAX_POSITION, dtype_name
from paged_conformance.harness import TOLERANCES
from paged_conformance.tracing import first_line
from paged_core.api import LINEAR_KINDS, AttentionBackend, FusedOps

REFERENCE = FusedOps()
"""The oracle of every fused check."""
METHODS: tuple[str, ...] = (
    "rms_norm",
    "add_rms_norm",
    "silu_and_mul",
    "rotary",
    "rotate_heads",
    "pack_linear",
    "linear",
    "lora_shrink",
    "lora_expand",
    "pack_experts",
    "moe",
    "experts",
)
"""The overridable methods of :class:`FusedOps`."""
ROW_SCALES: tuple[float, ...] = (1e-3, 1.0, 40.0, 0.1)
"""Magnitudes of successive norm input rows: at 1e-3 the mean square (1e-6) is of the order of ``eps``, so
mishandling ``eps`` shows; at 40 a sum of squares overflows float16."""
ZERO_ROW = 5
"""Norm inputs with more rows than this have this row all zeros (only ``eps`` keeps it finite)."""
VIEW_OFFSET = 3
"""Columns of NaN before a column view (its data does not start at its buffer's start)."""
VIEW_PAD = 5
"""Columns of NaN after a column view or a QKV buffer's last head."""


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    """Float32 normal values on the CPU (cast and moved by the caller)."""
    return torch.randn(*shape, generator=gen) * scale


def norm_rows(gen: torch.Generator, tokens: int, hidden: int) -> torch.Tensor:
    """``[tokens, hidden]`` rows of the magnitudes in :data:`ROW_SCALES`, in turn; row :data:`ZERO_ROW` is zero."""
    scales = torch.tensor([ROW_SCALES[t % len(ROW_SCALES)] for t in range(tokens)])
    x = randn(gen, tokens, hidden) * scales[:, None]
    if tokens > ZERO_ROW:
        x[ZERO_ROW] = 0.0
    return x


def norm_weight(gen: torch.Generator, hidden: int) -> torch.Tensor:
    """A norm weight around 1 (as trained ones are), never the all-ones a kernel could get away with ignoring."""
    return 1.0 + 0.5 * randn(gen, hidden)


def rope_cache(head_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The cos/sin cache as the contract documents it: ``[max_position, D]`` float32, cos halves then sin halves.

    Row ``p`` holds ``cos(p * f_i)`` in columns ``i < D/2`` and ``sin(p * f_i)``
    in columns ``D/2 + i``, with ``f_i = base ** (-2i / D)`` (angles in float64).
    A new tensor on every call (built once per head size).
    """
    return _rope_cache(head_size, ROTARY_MAX_POSITION, ROTARY_BASE).to(device, copy=True)


def assert_rope_cache_untouched(cache: torch.Tensor, head_size: int, what: str) -> None:
    """Fail if ``cache`` (from :func:`rope_cache`) no longer holds what it was made with."""
    if not torch.equal(_bits(cache.cpu()), _bits(_rope_cache(head_size, ROTARY_MAX_POSITION, ROTARY_BASE))):
        raise AssertionError(f"{what} modified the cos_sin_cache in place: inputs must be left untouched")


@functools.lru_cache(maxsize=8)
def _rope_cache(head_size: int, max_position: int, base: float) -> torch.Tensor:
    inv_freq = base ** -(torch.arange(0, head_size, 2, dtype=torch.float64) / head_size)
    angles = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1).float()


def positions(gen: torch.Generator, tokens: int, max_position: int = ROTARY_MAX_POSITION) -> torch.Tensor:
    """Int64 positions in no order: the cache's last row first, then random ones (a repeat among them), then 0."""
    pos = torch.randint(0, max_position, (tokens,), generator=gen, dtype=torch.int64)
    pos[0] = max_position - 1
    if tokens > 1:
        pos[-1] = 0
    if tokens > 3:
        pos[2] = pos[1]  # two sequences' tokens at one position
    return pos


# --- views -------------------------------------------------------------------------------------------------------


def column_view(t: torch.Tensor) -> torch.Tensor:
    """The values of ``[R, C]`` ``t`` as columns ``3 .. 3+C`` of a wider NaN buffer (row stride ``C + 8``)."""
    rows, cols = t.shape
    buffer = torch.full((rows, VIEW_OFFSET + cols + VIEW_PAD), float("nan"), dtype=t.dtype, device=t.device)
    view = buffer[:, VIEW_OFFSET : VIEW_OFFSET + cols]
    view.copy_(t)
    return view


def spaced_view(t: torch.Tensor) -> torch.Tensor:
    """The values of 1-d ``t`` at every other element of a NaN buffer, from its second (stride 2, offset 1)."""
    buffer = torch.full((2 * t.shape[0] + 1,), float("nan"), dtype=t.dtype, device=t.device)
    view = buffer[1::2][: t.shape[0]]
    view.copy_(t)
    return view


def transposed_view(t: torch.Tensor) -> torch.Tensor:
    """The values of ``[R, C]`` ``t`` in column-major storage (strides ``(1, R)``), as a transposed checkpoint gives."""
    return t.t().contiguous().t()


def qkv_views(query: torch.Tensor, key: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``query`` ``[T, Hq, D]`` and ``key`` ``[T, Hk, D]`` as slices of one merged QKV projection output.

    The buffer is ``[T, (Hq + 2 Hk) D + 5]``: q, k, then finite values in
    the value heads and NaN after them, as a fused projection lays them out.
    """
    tokens, hq, d = query.shape
    hk = key.shape[1]
    width = (hq + 2 * hk) * d
    buffer = torch.full((tokens, width + VIEW_PAD), float("nan"), dtype=query.dtype, device=query.device)
    buffer[:, (hq + hk) * d : width] = randn(gen, tokens, hk * d).to(buffer)
    q = buffer[:, : hq * d].view(tokens, hq, d)
    k = buffer[:, hq * d : (hq + hk) * d].view(tokens, hk, d)
    q.copy_(query)
    k.copy_(key)
    return q, k


def head_major_view(t: torch.Tensor) -> torch.Tensor:
    """The values of ``[T, H, D]`` ``t`` stored heads first, ``[H, T, D]``, after a row of NaN in each head (token
    stride ``D``, head stride ``(T + 1) D``), seen as ``[T, H, D]``: a transposed attention output."""
    tokens, heads, d = t.shape
    buffer = torch.full((heads, tokens + 1, d), float("nan"), dtype=t.dtype, device=t.device)
    view = buffer[:, 1:].transpose(0, 1)
    view.copy_(t)
    return view


# --- checks ------------------------------------------------------------------------------------------------------


def _root(t: torch.Tensor) -> torch.Tensor:
    """The tensor owning a view's memory (the view's base), or ``t`` itself."""
    base = t._base
    return t if base is None else base


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as integers of the same width (NaN compares equal to the same NaN)."""
    flat = t.contiguous().reshape(-1)
    return flat if not flat.is_floating_point() else flat.view(_BITS[flat.element_size()])


class Untouched:
    """Bitwise copies of the memory under some tensors (a view's whole buffer), to prove calls left it alone."""

    def __init__(self, tensors: Mapping[str, torch.Tensor | None]) -> None:
        self.names: dict[int, str] = {}
        """Input names per storage; inputs sharing one buffer (q and k of one QKV output) as ``query/key``."""
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for name, t in tensors.items():
            if t is None:
                continue
            root = _root(t)
            ptr = root.untyped_storage().data_ptr()
            if ptr in self.names:  # one copy covers every view of a buffer
                self.names[ptr] += f"/{name}"
                continue
            self.names[ptr] = name
            self.saved[ptr] = (root, root.clone())

    def check(self, what: str) -> None:
        """Fail naming the first input whose memory (anywhere in its buffer) changed."""
        for ptr, (root, copy) in self.saved.items():
            now, before = _bits(root), _bits(copy)
            if torch.equal(now, before):
                continue
            changed = int((now != before).sum())
            raise AssertionError(
                f"{what} modified its input {self.names[ptr]} in place ({changed}/{root.numel()} elements of its "
                "buffer changed): inputs must be left untouched, results returned as new tensors"
            )

    def assert_not_aliased(self, outputs: Sequence[torch.Tensor], what: str) -> None:
        """Fail if an output lives in an input's memory (returned in place, or as a view of it)."""
        for i, out in enumerate(outputs):
            name = self.names.get(out.untyped_storage().data_ptr())
            if name is not None:
                raise AssertionError(
                    f"{what}: output {i} shares memory with the input {name} (outputs must be new tensors)"
                )


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """Fail with the worst element, and how many are off, when ``got`` is outside the dtype's tolerance of ``want``."""
    atol, rtol = TOLERANCES.get(dtype, (1e-2, 1e-2))
    a, w = got.detach().float().cpu(), want.detach().float().cpu()
    err = (a - w).abs()
    bad = ~(err <= atol + rtol * w.abs())  # NaN anywhere is bad
    if not bad.any():
        return
    err = err.nan_to_num(float("inf"))
    flat = int(err.argmax())
    index = [int(i) for i in torch.unravel_index(torch.tensor(flat), err.shape)]
    g, e = float(a.reshape(-1)[flat]), float(w.reshape(-1)[flat])
    raise AssertionError(
        f"{what} mismatch: max abs error {float(err.max()):.3g} at {index} (got {g:.6g}, expected {e:.6g}); "
        f"{int(bad.sum())}/{bad.numel()} elements outside atol={atol}, rtol={rtol} ({dtype_name(dtype)})"
    )


def as_tuple(result: object, what: str, count: int) -> tuple[torch.Tensor, ...]:
    """An op's result as a tuple of ``count`` tensors, or a failure saying what came back."""
    items = result if isinstance(result, (tuple, list)) else (result,)
    if len(items) != count or not all(isinstance(t, torch.Tensor) for t in items):
        kinds = ", ".join(type(t).__name__ for t in items)
        raise AssertionError(f"{what} returned ({kinds}), expected {count} tensor(s)")
    return tuple(items)


def check_call(
    what: str,
    dtype: torch.dtype,
    call: Callable[..., object],
    oracle: Callable[..., object],
    tensors: Mapping[str, torch.Tensor],
    shapes: Sequence[tuple[int, ...]],
    extra: Sequence[object] = (),
    oracle_extra: Sequence[object] | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Call ``call(*tensors, *extra)`` and compare every output with ``oracle`` on contiguous copies.

    The outputs must be new tensors (no input's memory), in ``dtype``, of
    ``shapes``, on the inputs' device, and within the dtype's tolerance of
    the oracle's; every input's buffer must be bit-identical afterwards.
    Returns each (output, oracle's output).
    """
    args = list(tensors.values())
    copies = [t.detach().clone(memory_format=torch.contiguous_format) for t in args]
    want = as_tuple(
        oracle(*copies, *(extra if oracle_extra is None else oracle_extra)), f"reference {what}", len(shapes)
    )
    guard = Untouched(tensors)
    got = as_tuple(call(*args, *extra), what, len(shapes))
    guard.check(what)
    guard.assert_not_aliased(got, what)
    device = args[0].device
    for i, (out, ref, shape) in enumerate(zip(got, want, shapes, strict=True)):
        label = what if len(shapes) == 1 else f"{what} output {i}"
        if tuple(out.shape) != tuple(shape):
            raise AssertionError(f"{label}: shape {tuple(out.shape)}, expected {tuple(shape)}")
        if out.dtype != dtype:
            raise AssertionError(f"{label}: dtype {out.dtype}, expected the input's {dtype}")
        if out.device != device:
            raise AssertionError(f"{label}: on {out.device}, the inputs are on {device}")
        assert_close(out, ref, dtype, label)
    return list(zip(got, want, strict=True))


def linear_weight(gen: torch.Generator, out_features: int, in_features: int) -> torch.Tensor:
    """A weight scaled so outputs are of order 1 whatever ``in_features``."""
    return randn(gen, out_features, in_features, scale=1.0 / math.sqrt(in_features))


def fused_ops_info(make_backend: Callable[[], AttentionBackend]) -> dict[str, object]:
    """What the report says of a backend's ``fused_ops()``: ``name``, ``class``, ``overrides``, ``linear_formats``
    (the packed formats it declares, in the core's order, then any unknown names sorted),
    ``q8_activation_formats`` and ``batch_invariant_linear`` (likewise), ``batch_invariant_layer_ops``,
    ``moe_formats`` and ``batch_invariant_moe`` (likewise); or ``error``."""
    try:
        ops = make_backend().fused_ops()
    except Exception as exc:
        return {"error": first_line(exc)}
    cls = type(ops)
    overrides = [m for m in METHODS if getattr(cls, m, None) is not getattr(FusedOps, m)]
    declared = getattr(ops, "linear_formats", None)
    # Anything but a collection declares nothing here (and fails the declaration check).
    names = {str(f) for f in declared} if isinstance(declared, (set, frozenset, list, tuple)) else set()
    formats = [f for f in LINEAR_FORMATS if f in names] + sorted(names - set(LINEAR_FORMATS))
    q8: object = getattr(ops, "q8_activation_formats", frozenset())
    q8_names = {str(f) for f in q8} if isinstance(q8, (set, frozenset, list, tuple)) else set()
    q8_formats = [f for f in LINEAR_FORMATS if f in q8_names] + sorted(q8_names - set(LINEAR_FORMATS))
    kinds: object = getattr(ops, "batch_invariant_linear", frozenset())
    kind_names = {str(k) for k in kinds} if isinstance(kinds, (set, frozenset, list, tuple)) else set()
    invariant = [k for k in LINEAR_KINDS if k in kind_names] + sorted(kind_names - set(LINEAR_KINDS))

    def listed(attribute: str, order: Sequence[str]) -> list[str]:
        value: object = getattr(ops, attribute, frozenset())
        found = {str(n) for n in value} if isinstance(value, (set, frozenset, list, tuple)) else set()
        return [n for n in order if n in found] + sorted(found - set(order))

    return {
        "name": str(getattr(ops, "name", "")),
        "class": f"{cls.__module__}:{cls.__qualname__}",
        "overrides": overrides,
        "linear_formats": formats,
        "q8_activation_formats": q8_formats,
        "batch_invariant_linear": invariant,
        "batch_invariant_layer_ops": getattr(ops, "batch_invariant_layer_ops", False) is True,
        "moe_formats": listed("moe_formats", LINEAR_FORMATS),
        "batch_invariant_moe": listed("batch_invariant_moe", LINEAR_KINDS),
    }
