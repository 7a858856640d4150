"""Decode attention with a group's prompt read once for all its samples (cascade attention).

A decode step feeds each running sample one token. Its attention reads the keys and values of its group's prompt,
then those of its own tokens. Gathered per row (``PagedContext``), the prompt is copied once per sample: with G
samples of a 256-token prompt in flight that copy is most of the step's memory traffic and its largest transient
(about rows x context x 12 KiB a layer at Qwen3-1.7B's shape). Here each group's prompt is gathered once; every row
scores it with its own query (one batched product per group), scores its own tokens apart, and the two partial
softmaxes are merged by their log-sum-exp: the same attention, with the prompt's keys and values never replicated.

transformers picks the attention function by name, so the engine switches its model to ``infsample_paged``: for
every input but ours it is transformers' ``sdpa`` (same masks, same kernels), so ``generate`` on the same model
object is unchanged; for a ``SharedPromptDecode`` pass it is the cascade above, computed in float32.
"""

from __future__ import annotations

import torch

ATTENTION = "infsample_paged"


class SharedPromptDecode:
    """One decode pass's view of the pool (duck-typing transformers' ``Cache.update``): row b is a sample of group
    ``row_groups[b]`` whose prompt sits at ``prompt_slots[row_groups[b]]``, and whose own fed tokens (the one this
    pass writes last) sit at ``own_slots[b]``."""

    def __init__(self, pool, row_groups: list[int], prompt_slots: dict[int, torch.Tensor],
                 own_slots: list[torch.Tensor]):
        self.pool = pool
        groups = list(dict.fromkeys(row_groups))  # in order of first appearance
        index = {g: i for i, g in enumerate(groups)}
        rows = [[] for _ in groups]
        for b, g in enumerate(row_groups):
            rows[index[g]].append(b)
        self.rows_of_group = [torch.tensor(r, device=pool.device) for r in rows]
        self.prompt_width, self.prompt_gather, self.prompt_mask = _padded([prompt_slots[g] for g in groups],
                                                                           pool.device)
        self.own_width, self.own_gather, self.own_mask = _padded(own_slots, pool.device)
        self.write = torch.stack([s[-1] for s in own_slots]).to(pool.device)  # [B]: the token each row feeds now

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        b, h, q, d = key_states.shape
        if q != 1:
            raise ValueError(f"SharedPromptDecode feeds one token per row, got {q}")
        for store, states in ((self.pool.k, key_states), (self.pool.v, value_states)):
            store[layer_idx].index_copy_(0, self.write, states.reshape(b, h, d).to(self.pool.dtype))
        k, v = self.pool.k[layer_idx], self.pool.v[layer_idx]
        groups = len(self.rows_of_group)
        parts = _Parts(self,
                       k.index_select(0, self.prompt_gather).view(groups, self.prompt_width, h, d),
                       v.index_select(0, self.prompt_gather).view(groups, self.prompt_width, h, d),
                       k.index_select(0, self.own_gather).view(b, self.own_width, h, d),
                       v.index_select(0, self.own_gather).view(b, self.own_width, h, d))
        return parts, parts  # (what transformers hands the attention function as key and value)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


class _Parts:
    """One layer's gathered keys and values: each group's prompt [groups, P, kv_heads, d], each row's own tokens
    [B, S, kv_heads, d]."""

    def __init__(self, ctx: SharedPromptDecode, prompt_k, prompt_v, own_k, own_v):
        self.ctx, self.prompt_k, self.prompt_v, self.own_k, self.own_v = ctx, prompt_k, prompt_v, own_k, own_v

    def attend(self, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """query [B, heads, 1, d] -> attention output [B, 1, heads, d] (sdpa_attention_forward's layout)."""
        b, heads, _, d = query.shape
        kv_heads = self.own_k.shape[2]
        q = query.reshape(b, kv_heads, heads // kv_heads, d).float()  # query head i reads kv head i // (heads/kv)
        m_own, l_own, o_own = _partial(torch.einsum("bhrd,bshd->bhrs", q, self.own_k.float()) * scaling
                                       + self.ctx.own_mask[:, None, None, :], self.own_v.float(), "bhrs,bshd->bhrd")
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
