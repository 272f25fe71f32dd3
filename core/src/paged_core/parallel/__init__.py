"""Tensor parallelism on ``torch.distributed``: one model split across ranks, rank 0 inside the engine core.

* :mod:`~paged_core.parallel.tp_sizes`: which tensor-parallel sizes a model allows (checked before weights load).
* :mod:`~paged_core.parallel.rendezvous`: how ranks meet (a free loopback port, or torchrun's variables).
* :mod:`~paged_core.parallel.group`: the process group and the collectives the model path calls.
* :mod:`~paged_core.parallel.shard`: slicing a loaded model's projections in place (no model code forked).
* :mod:`~paged_core.parallel.experts`: expert parallelism (each rank keeps a share of every MoE layer's experts).
* :mod:`~paged_core.parallel.plans`: the step-plan channel from rank 0 to the workers (zmq, msgspec).
* :mod:`~paged_core.parallel.heartbeat`: liveness of ranks rank 0 cannot watch as processes.
* :mod:`~paged_core.parallel.placement`: which devices and threads each data-parallel core's ranks take.
* :mod:`~paged_core.parallel.leader`: rank 0's side: start ranks 1..N-1, send each step's plan, watch them.

A worker rank (ranks 1..N-1) loads and runs a model, so it sits above loading, in
:mod:`paged_core.engine_core.tp_worker`; nothing here imports loading or the engine.
"""
