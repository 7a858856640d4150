"""Cascade decode attention (``engines/shared_prefix.py``): each group's prompt read once, the same attention."""

import pytest
import torch

from verl_infsample.engines.kv_blocks import BlockPool
from verl_infsample.engines.shared_prefix import SharedPromptDecode, attention, own_length_buckets


@pytest.mark.parametrize("cut_tokens", [None, 1])
def test_the_cascade_is_attention_over_prompt_and_own_tokens(cut_tokens):
    """Three groups (prompts of 5, 17 and 1 tokens), six rows of 1 to 16 own tokens, grouped query attention (4 query
    heads on 2 kv heads): every row's output equals softmax(q k / sqrt(d)) v over its prompt and own tokens, the new
    token written into the pool first; each prompt is gathered once, not once per row. With ``cut_tokens=1`` the rows'
    own tokens are gathered in length buckets (each padded to its own longest): the same attention, less copied."""
    torch.manual_seed(0)
    heads, kv_heads, d, layer = 4, 2, 8, 1
    pool = BlockPool(layers=2, kv_heads=kv_heads, head_dim=d, dtype=torch.float32, device="cpu", block_size=4)
    for store in (pool.k, pool.v):
        for t in store:
            t.normal_()
    prompts = {g: pool.slots(pool.allocate(pool.blocks_for(n)), n) for g, n in ((7, 5), (3, 17), (9, 1))}
    row_groups = [7, 7, 3, 9, 3, 7]
    own = [pool.slots(pool.allocate(pool.blocks_for(n)), n) for n in (1, 3, 7, 2, 16, 5)]
    ctx = SharedPromptDecode(pool, row_groups, prompts, own, cut_tokens=cut_tokens)
    gathered = sum(len(gather) for _, _, gather, _ in ctx.own_buckets)
    assert (len(ctx.own_buckets), gathered) == ((1, 6 * 16) if cut_tokens is None else (4, 16 + 7 + 5 + 3 * 3))
    new_k, new_v = torch.randn(len(own), kv_heads, 1, d), torch.randn(len(own), kv_heads, 1, d)
    query = torch.randn(len(own), heads, 1, d)
    key, value = ctx.update(new_k, new_v, layer)
    out, _ = attention(None, query, key, value, None, scaling=d ** -0.5)

    assert out.shape == (len(own), 1, heads, d)
    assert key.prompt_k.shape[0] == len(prompts)  # one copy of each prompt, whatever the rows
    for b, (g, mine) in enumerate(zip(row_groups, own)):
        for store, new in ((pool.k, new_k), (pool.v, new_v)):
            assert torch.equal(store[layer][mine[-1]], new[b, :, 0])  # the new token, written before attending
        slots = torch.cat([prompts[g], mine])
        k, v = pool.k[layer][slots].double(), pool.v[layer][slots].double()  # [n, kv_heads, d]
        for h in range(heads):
            kv = h // (heads // kv_heads)
            weights = torch.softmax(k[:, kv] @ query[b, h, 0].double() * d ** -0.5, 0)
            torch.testing.assert_close(out[b, 0, h].double(), weights @ v[:, kv], atol=1e-5, rtol=1e-5)


def test_other_inputs_get_sdpa():
    """Anything but a ``SharedPromptDecode`` pass (a prefill, transformers' own ``generate``) is plain sdpa."""
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
    mask = torch.zeros(2, 1, 3, 5)
    mask[0, :, :, 4] = float("-inf")
    out, _ = attention(torch.nn.Module(), q, k, v, mask, scaling=0.3)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3).transpose(1, 2)
    torch.testing.assert_close(out, expected)


def test_own_length_buckets_cut_where_padding_is_wasted():
    """Rows go longest first into at most 4 buckets, each cut where it saves the most padded slots, and only while a
    cut saves at least ``cut_tokens``: one long row among many short ones is cut off; similar lengths are not."""
    lengths = [3, 250, 4, 2, 5, 3, 4, 2]
    buckets = own_length_buckets(lengths, cut_tokens=256)
    assert buckets == [[1], [4, 2, 6, 0, 5, 3, 7]]  # saving (250 - 5) x 7 = 1715
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    assert own_length_buckets(lengths, cut_tokens=2000) == [list(range(8))]  # the one cut saves too little
    assert own_length_buckets([10, 9, 10, 8], cut_tokens=256) == [[0, 1, 2, 3]]  # in the rows' own order
    assert len(own_length_buckets(list(range(1, 200)), cut_tokens=1)) == 4
