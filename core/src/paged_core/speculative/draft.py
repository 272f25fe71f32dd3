"""A draft model as proposer: a smaller model of the same tokenizer, with its own paged KV in the same engine.

The draft's KV cache has one block for each of the target's and is addressed through the target's
block tables, so it needs no block manager of its own: a sequence's draft KV lives in the blocks the
scheduler gave that sequence, and the scheduler reserves ``num_speculative_tokens`` lookahead slots
per row for the positions the draft writes past the scheduled tokens. Before proposing, the draft
catches up on the positions it has not computed (a new prompt, the tokens the target accepted),
in chunks of the step's token budget, then decodes ``k`` tokens, all rows in one batch per token.
Greedy target rows get the draft's argmax; sampled rows a draw from the draft's distribution at
the row's temperature, returned with the drafts so verification can use it. The draft's KV only
affects which drafts come (never the output): a block the draft did not fill, such as a
prefix-cache hit computed before, just lowers acceptance until recomputed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from paged_core.errors import ConfigError
from paged_core.runner.batch import BatchBuilder, RowState
from paged_core.runner.executors import StepExecutor
from paged_core.speculative.proposer import Proposal

if TYPE_CHECKING:
    from paged_core.memory.kv_cache_manager import KVCacheManager
    from paged_core.runner.forward import ModelForward
    from paged_core.sampling.state import SamplingState
    from paged_core.sched.request import Request


def check_same_vocabulary(target_tokenizer: Any, draft_tokenizer: Any, target_vocab: int, draft_vocab: int) -> None:
    """Refuse a draft whose vocabulary differs from the target's, naming the difference."""
    if target_vocab != draft_vocab:
        raise ConfigError(
            f"speculative: the draft model's vocabulary has {draft_vocab} entries, the target's "
            f"{target_vocab}; a draft model must share the target's tokenizer"
        )
    if target_tokenizer is None or draft_tokenizer is None:
        return
    ours, theirs = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if ours != theirs:
        differ = sorted(set(ours.items()) ^ set(theirs.items()), key=lambda kv: kv[1])[:3]
        raise ConfigError(
            f"speculative: the draft model's tokenizer differs from the target's (e.g. "
            f"{differ}); a draft model must share the target's tokenizer"
        )


class DraftModelProposer:
    """Drafts from a smaller model whose KV blocks mirror the target's block ids."""

    name = "draft"
    needs_lookahead = True

    def __init__(
        self,
        forward: ModelForward,
        kv_caches: list[torch.Tensor],
        kv: KVCacheManager,
        *,
        block_size: int,
        max_num_tokens: int,
        max_num_reqs: int,
        max_model_len: int,
        device: torch.device,
        backend: Any,
    ) -> None:
        self.executor = StepExecutor(forward, backend, kv_caches)
        self.kv = kv
        self.budget = max_num_tokens
        max_blocks = -(-max_model_len // block_size) + 1
        self.batches = BatchBuilder(max_num_tokens + max_num_reqs, max_num_reqs, max_blocks, block_size, device)
        # Per sequence: (preemptions seen, positions whose draft KV holds the sequence's real tokens, last drafts).
        self._seen: dict[str, tuple[int, int, list[int]]] = {}

    def forget(self, live: set[str]) -> None:
        """Drop what is kept for sequences not in ``live``."""
        for rid in [r for r in self._seen if r not in live]:
            del self._seen[rid]

    def kv_alive(self, request_id: str) -> bool:
        """Whether the scheduler still holds blocks for ``request_id`` (so its draft KV may be reused)."""
        return request_id in self.kv.req_to_blocks

    def propose(
        self, reqs: Sequence[Request], ks: Sequence[int], states: Sequence[SamplingState]
    ) -> list[Proposal | None]:
        """Up to ``ks[i]`` drafts for each request (whose last token is its only uncomputed one)."""
        live_ids = {r.request_id for r in reqs}
        temperatures = [0.0 if s.params.is_greedy else s.params.temperature for s in states]
        rows = {r.request_id: RowState(list(r.all_token_ids), self.kv.block_ids(r), self._valid(r)) for r in reqs}
        logits = self._catch_up(reqs, rows)
        drafts: list[list[int]] = [[] for _ in reqs]
        probs: list[list[torch.Tensor]] = [[] for _ in reqs]
        live = list(range(len(reqs)))
        for step in range(max(ks)):
            for i in live:
                t = temperatures[i]
                if t <= 0:
                    tok = int(logits[i].argmax())
                else:
                    q = torch.softmax(logits[i].float() / t, dim=-1)
                    tok = int(torch.multinomial(q, 1))
                    probs[i].append(q)
                drafts[i].append(tok)
                rows[reqs[i].request_id].token_ids.append(tok)
            live = [i for i in live if len(drafts[i]) < ks[i]]
            if not live or step + 1 >= max(ks):
                break
            _, logits_live = self._run([(reqs[i].request_id, rows[reqs[i].request_id], 1) for i in live])
            full = torch.empty((len(reqs), logits_live.shape[1]), dtype=logits_live.dtype, device=logits_live.device)
            full[torch.tensor(live, device=full.device)] = logits_live
            logits = full
        self.forget(live_ids | {r for r in self._seen if self.kv_alive(r)})
        for i, r in enumerate(reqs):
            self._seen[r.request_id] = (r.num_preemptions, r.num_tokens, drafts[i])
        return [Proposal(d, torch.stack(p) if p else None) for d, p in zip(drafts, probs, strict=True)]

    def _valid(self, req: Request) -> int:
        """Positions of ``req`` whose draft KV is known good: real tokens computed, accepted drafts included."""
        seen = self._seen.get(req.request_id)
        if seen is None or seen[0] != req.num_preemptions:
            return 0  # new here, or preempted since: its blocks were given back
        _, known, drafts = seen
        tokens = req.all_token_ids
        kept = 0
        # The draft wrote positions known-1 .. known+len(drafts)-2: the last real token, then drafts[:-1].
        while kept < len(drafts) - 1 and known + kept < len(tokens) and tokens[known + kept] == drafts[kept]:
            kept += 1
        return min(known + kept, len(tokens) - 1)

    def _catch_up(self, reqs: Sequence[Request], rows: dict[str, RowState]) -> torch.Tensor:
        """Compute every uncomputed position of each row up to its last token, in budget-sized chunks;
        the logits after each row's last token."""
        pending = [(r.request_id, rows[r.request_id]) for r in reqs]
        last: dict[str, torch.Tensor] = {}
        while pending:
            batch: list[tuple[str, RowState, int]] = []
            budget = self.budget
            for rid, row in pending:
                if budget <= 0:
                    break
                n = min(len(row.token_ids) - row.num_computed, budget)
                batch.append((rid, row, n))
                budget -= n
            ids, out = self._run(batch)
            for j, rid in enumerate(ids):
                last[rid] = out[j]
            pending = [(rid, row) for rid, row in pending if row.num_computed < len(row.token_ids)]
        return torch.stack([last[r.request_id] for r in reqs])

    @torch.inference_mode()
    def _run(self, batch: list[tuple[str, RowState, int]]) -> tuple[list[str], torch.Tensor]:
        """One eager draft forward over ``batch``: the ids that got logits (row order) and those logits."""
        built = self.batches.build(batch)
        out = self.executor.run(built)
        for _, row, n in batch:
            row.num_computed += n
        return built.sample_req_ids, out
