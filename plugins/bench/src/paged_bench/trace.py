"""Per-step KV occupancy samples and the figures drawn from them (``kv-util``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_POINTS = 500
"""Series written to JSON are thinned to at most this many points (the figures use every sample)."""


@dataclass
class UtilizationTrace:
    """One sample per scheduler step: KV slots allocated, slots holding real tokens, running requests.

    Time is counted in steps, the unit both allocators share; every step
    weighs the same.
    """

    name: str
    num_slots: int
    allocated: list[int] = field(default_factory=list)
    used: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    preemptions: int = 0

    def sample(self, allocated: int, used: int, running: int) -> None:
        """Record one step; ``used`` can never exceed ``allocated`` (that would be a bookkeeping bug)."""
        if used > allocated:
            raise ValueError(f"{self.name}: {used} slots hold tokens but only {allocated} are allocated")
        self.allocated.append(allocated)
        self.used.append(used)
        self.running.append(running)

    @property
    def steps(self) -> int:
        return len(self.allocated)

    @property
    def utilization(self) -> float:
        """Time-averaged share of allocated slots holding real tokens: sum(used) / sum(allocated)."""
        total = sum(self.allocated)
        return sum(self.used) / total if total else 0.0

    @property
    def budget_occupancy(self) -> float:
        """Time-averaged share of the whole budget holding real tokens."""
        return sum(self.used) / (self.num_slots * self.steps) if self.steps else 0.0

    @property
    def peak_concurrent(self) -> int:
        return max(self.running, default=0)

    @property
    def mean_concurrent(self) -> float:
        return sum(self.running) / self.steps if self.steps else 0.0

    def step_utilization(self) -> list[float]:
        """Used over allocated at each step (0 where nothing is allocated)."""
        return [u / a if a else 0.0 for a, u in zip(self.allocated, self.used, strict=True)]

    def to_dict(self) -> dict[str, Any]:
        """The figures plus thinned per-step series (see :data:`MAX_POINTS`)."""
        stride = max(1, -(-self.steps // MAX_POINTS))
        return {
            "name": self.name,
            "steps": self.steps,
            "utilization": self.utilization,
            "budget_occupancy": self.budget_occupancy,
            "peak_concurrent": self.peak_concurrent,
            "mean_concurrent": self.mean_concurrent,
            "preemptions": self.preemptions,
            "series_stride": stride,
            "series": {
                "step": list(range(0, self.steps, stride)),
                "utilization": self.step_utilization()[::stride],
                "running": self.running[::stride],
            },
        }
