"""Decode attention with a group's prompt read once for all its samples (cascade attention).

A decode step feeds each running sample one token. Its attention reads the keys and values of its group's prompt,
then those of its own tokens. Gathered per row (``PagedContext``), the prompt is copied once per sample: with G
samples of a 256-token prompt in flight that copy is most of the step's memory traffic and its largest transient
(about rows x context x 12 KiB a layer at Qwen3-1.7B's shape). Here each group's prompt is gathered once; every row
scores it with its own query (one batched product per group), scores its own tokens apart, and the two partial
softmaxes are merged by their log-sum-exp: the same attention, with the prompt's keys and values never replicated.

Rows' own tokens are gathered padded to the longest row. Under Infinite Sampling a step runs many short samples
beside a few paced long ones (at rollout.n=1024 under a KV budget the padded gather was 3x the tokens it holds), so
rows are cut into a few buckets by own length, each padded to its own longest, where the copy a cut saves is worth
the extra kernels (``OWN_CUT_TOKENS``: small on a CPU, where copies are slow; large on a GPU, where launches are).

The cascade pays for its copies saved with more, smaller kernels (per group, per bucket, and the merge), so a step
takes it only where the copies it saves are worth that (``shares_prompt``): a few thousand redundant prompt slots
are cheaper gathered per row, tens of thousands are not, and on a GPU a big copy is also a big transient, so the same
threshold keeps the cascade where the memory it saves matters (the crossover as measured: docs/results.md).

transformers picks the attention function by name, so the engine switches its model to ``infsample_paged``: for
every input but ours it is transformers' ``sdpa`` (same masks, same kernels), so ``generate`` on the same model
object is unchanged; for a ``SharedPromptDecode`` pass it is the cascade above, computed in float32.
"""

from __future__ import annotations

from typing import Iterable

import torch

ATTENTION = "infsample_paged"
OWN_BUCKETS = 4  # at most this many own-length buckets per step
# padded token slots a cut must save, per device type: a cut adds a bucket (a copy and more kernel launches), worth
# it only where the padding it saves costs more (figures and how they were measured: docs/results.md)
OWN_CUT_TOKENS = {"cpu": 4096}
DEFAULT_CUT_TOKENS = 65_536
SHARE_PROMPT_TOKENS = 8192  # redundant prompt token slots a step must hold for the cascade (see above)


def shares_prompt(row_prompt_lens: Iterable[int], group_prompt_lens: Iterable[int]) -> bool:
    """Whether a decode step should read each group's prompt once (the cascade) rather than gather it per row: when
    the per-row copies it saves, sum(rows' prompt lengths) - sum(distinct groups' prompt lengths), reach
    ``SHARE_PROMPT_TOKENS``."""
    return sum(row_prompt_lens) - sum(group_prompt_lens) >= SHARE_PROMPT_TOKENS


class SharedPromptDecode:
    """One decode pass's view of the pool (duck-typing transformers' ``Cache.update``): row b is a sample of group
    ``row_groups[b]`` whose prompt sits at ``prompt_slots[row_groups[b]]``, and whose own fed tokens (the one this
    pass writes last) sit at ``own_slots[b]``."""

    def __init__(self, pool, row_groups: list[int], prompt_slots: dict[int, torch.Tensor],
                 own_slots: list[torch.Tensor], cut_tokens: int | None = None):
        self.pool = pool
        groups = list(dict.fromkeys(row_groups))  # in order of first appearance
        index = {g: i for i, g in enumerate(groups)}
        rows = [[] for _ in groups]
        for b, g in enumerate(row_groups):
            rows[index[g]].append(b)
        self.rows_of_group = [torch.tensor(r, device=pool.device) for r in rows]
        self.prompt_width, self.prompt_gather, self.prompt_mask = _padded([prompt_slots[g] for g in groups],
                                                                           pool.device)
        if cut_tokens is None:
            cut_tokens = OWN_CUT_TOKENS.get(torch.device(pool.device).type, DEFAULT_CUT_TOKENS)
        self.own_buckets = []  # (rows or None for all, width, padded gather, mask), rows by own length
        for bucket in own_length_buckets([len(s) for s in own_slots], cut_tokens):
            width, gather, mask = _padded([own_slots[b] for b in bucket], pool.device)
            every_row = len(bucket) == len(own_slots)  # (one bucket: the rows as they are)
            self.own_buckets.append((None if every_row else torch.tensor(bucket, device=pool.device),
                                     width, gather, mask))
        self.write = torch.stack([s[-1] for s in own_slots]).to(pool.device)  # [B]: the token each row feeds now

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        b, h, q, d = key_states.shape
        if q != 1:
            raise ValueError(f"SharedPromptDecode feeds one token per row, got {q}")
        for store, states in ((self.pool.k, key_states), (self.pool.v, value_states)):
            store[layer_idx].index_copy_(0, self.write, states.reshape(b, h, d).to(self.pool.dtype))
        k, v = self.pool.k[layer_idx], self.pool.v[layer_idx]
        groups = len(self.rows_of_group)
        own = [(k.index_select(0, gather).view(-1, width, h, d), v.index_select(0, gather).view(-1, width, h, d))
               for _, width, gather, _ in self.own_buckets]
        parts = _Parts(self,
                       k.index_select(0, self.prompt_gather).view(groups, self.prompt_width, h, d),
                       v.index_select(0, self.prompt_gather).view(groups, self.prompt_width, h, d),
                       own)
        return parts, parts  # (what transformers hands the attention function as key and value)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


class _Parts:
    """One layer's gathered keys and values: each group's prompt [groups, P, kv_heads, d], and per own-length bucket
    its rows' own tokens ([rows, S, kv_heads, d] keys, values)."""

    def __init__(self, ctx: SharedPromptDecode, prompt_k, prompt_v, own: list[tuple[torch.Tensor, torch.Tensor]]):
        self.ctx, self.prompt_k, self.prompt_v, self.own = ctx, prompt_k, prompt_v, own

    def attend(self, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """query [B, heads, 1, d] -> attention output [B, 1, heads, d] (sdpa_attention_forward's layout)."""
        b, heads, _, d = query.shape
        kv_heads = self.prompt_k.shape[2]
        q = query.reshape(b, kv_heads, heads // kv_heads, d).float()  # query head i reads kv head i // (heads/kv)
        m_own = l_own = o_own = None
        for (rows, _, _, mask), (own_k, own_v) in zip(self.ctx.own_buckets, self.own):
            part = _partial(torch.einsum("bhrd,bshd->bhrs", q if rows is None else q[rows], own_k.float()) * scaling
                            + mask[:, None, None, :], own_v.float(), "bhrs,bshd->bhrd")
            if rows is None:  # one bucket: every row, in order
                m_own, l_own, o_own = part
                break
            if m_own is None:
                m_own = q.new_empty(b, kv_heads, heads // kv_heads, 1)
                l_own, o_own = torch.empty_like(m_own), torch.empty_like(q)
            m_own[rows], l_own[rows], o_own[rows] = part
        m_pr, l_pr, o_pr = torch.empty_like(m_own), torch.empty_like(l_own), torch.empty_like(o_own)
        for g, rows in enumerate(self.ctx.rows_of_group):
            scores = (torch.einsum("bhrd,phd->bhrp", q[rows], self.prompt_k[g].float()) * scaling
                      + self.ctx.prompt_mask[g])
            m_pr[rows], l_pr[rows], o_pr[rows] = _partial(scores, self.prompt_v[g].float(), "bhrp,phd->bhrd")
        m = torch.maximum(m_pr, m_own)
        w_pr, w_own = torch.exp(m_pr - m), torch.exp(m_own - m)
        out = (o_pr * w_pr + o_own * w_own) / (l_pr * w_pr + l_own * w_own)  # [B, kv_heads, heads/kv, d]
        return out.reshape(b, heads, d)[:, None].to(query.dtype)


def _partial(scores: torch.Tensor, values: torch.Tensor, contract: str):
    """A softmax over the last axis of ``scores``, unnormalised: (max, sum of exp, exp-weighted values)."""
    m = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - m)
    return m, e.sum(-1, keepdim=True), torch.einsum(contract, e, values)


def own_length_buckets(lengths: list[int], cut_tokens: int, buckets: int = OWN_BUCKETS) -> list[list[int]]:
    """Rows (indices into ``lengths``) in at most ``buckets`` groups of similar length, longest first: each cut is
    where it saves the most padded token slots, (its bucket's width - the row's length) x the rows from there on,
    taken while it saves at least ``cut_tokens``. One group, all rows in order, when no cut is worth it."""
    if max(lengths, default=0) * len(lengths) - sum(lengths) < max(1, cut_tokens):  # all the padding: too little
        return [list(range(len(lengths)))]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    ordered = torch.tensor([lengths[i] for i in order], dtype=torch.int64)
    cuts = [0, len(order)]
    while len(cuts) - 1 < buckets:
        best, at = 0, None
        for a, z in zip(cuts, cuts[1:]):
            if z - a < 2:
                continue
            saving = (ordered[a] - ordered[a + 1:z]) * torch.arange(z - a - 1, 0, -1)
            i = int(torch.argmax(saving))
            if int(saving[i]) > best:
                best, at = int(saving[i]), a + 1 + i
        if at is None or best < cut_tokens:
            break
        cuts = sorted([*cuts, at])
    if len(cuts) == 2:
        return [list(range(len(lengths)))]
    return [order[a:z] for a, z in zip(cuts, cuts[1:])]


def _padded(slots: list[torch.Tensor], device) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(width, flat slots padded to it, additive mask [len(slots), width]: 0 on a slot, -inf on the padding)."""
    lengths = torch.tensor([len(s) for s in slots])
    gather = torch.nn.utils.rnn.pad_sequence(slots, batch_first=True)
    width = gather.shape[1]
    mask = torch.zeros(len(slots), width)
    mask[torch.arange(width)[None, :] >= lengths[:, None]] = float("-inf")
    return width, gather.reshape(-1).to(device), mask.to(device)


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
              **kwargs):
    """The ``infsample_paged`` attention function: the cascade for a ``SharedPromptDecode`` pass, sdpa otherwise."""
    if isinstance(key, _Parts):
        return key.attend(query, scaling if scaling is not None else query.shape[-1] ** -0.5), None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


def use_shared_prefix_attention(model) -> None:
    """Register ``infsample_paged`` with transformers (once) and switch ``model`` to it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # masks as for sdpa, for every caller but the engine
    model.set_attn_implementation(ATTENTION)
