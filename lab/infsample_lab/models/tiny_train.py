"""Training the tiny model on its corpus: examples as token rows, token-budget batches, and a lean AdamW loop.

The loop runs Qwen3's forward from the model's own modules without the transformers wrappers (most of a step's time
at these sizes), once per shared prefix where a batch's rows share a long one. Imports torch inside the functions.
"""

from __future__ import annotations

import contextlib
import math
import random
import sys

from .tiny_dialogue import Dialogue, Segment
from .tiny_tokenizer import IM_END, render_chat


def as_dialogue(example) -> Dialogue:
    """A corpus example as a Dialogue: a (prompt, answer) pair is the prompt's chat (context) and the answer."""
    if isinstance(example, Dialogue):
        return example
    prompt, answer = example
    return Dialogue((Segment(render_chat(prompt), learn=False), Segment(answer + IM_END, learn=True)))


def encode_corpus(tok, corpus: list[Dialogue], max_seq_len: int) -> list[tuple[list[int], list[bool]]]:
    """Token ids and, per token, whether loss is taken on it (the learnt segments: answers and their <|im_end|>).

    ``tok`` is the raw ``tokenizers.Tokenizer``. Each segment is encoded on its own, as verl's agent loop builds a
    conversation turn by turn; a prompt is encoded exactly as the chat template renders it.
    """
    flat = [seg for d in corpus for seg in d.segments]
    encoded = iter(tok.encode_batch([seg.text for seg in flat], add_special_tokens=False))
    out = []
    for d in corpus:
        ids: list[int] = []
        learn: list[bool] = []
        for seg in d.segments:
            seg_ids = next(encoded).ids
            ids += seg_ids
            learn += [seg.learn] * len(seg_ids)
        out.append((ids[:max_seq_len], learn[:max_seq_len]))
    return out


def _batches(encoded, batch_tokens, rng: random.Random):
    """Token-budget batches of similar lengths (right-padded; causal attention never looks at the padding)."""
    order = sorted(range(len(encoded)), key=lambda i: (len(encoded[i][0]), rng.random()))
    batches, cur, cur_max = [], [], 0
    for i in order:
        n = len(encoded[i][0])
        if cur and max(cur_max, n) * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, n)
    if cur:
        batches.append(cur)
    return batches


def _lean_hidden(model, input_ids, cos, sin):
    """Qwen3's forward (causal, no padding mask, no cache), from the model's own modules without the wrappers.

    At these sizes much of the HF forward's time is bookkeeping (masks, outputs, kwargs); this computes the same final
    hidden states (the test suite checks it against ``model.model(...)``) with less of it.
    """
    import torch.nn.functional as F
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    inner = model.model
    b, t = input_ids.shape
    cos, sin = cos[:, :t], sin[:, :t]
    x = inner.embed_tokens(input_ids)
    for layer in inner.layers:
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q = attn.q_norm(attn.q_proj(h).view(b, t, -1, attn.head_dim)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(h).view(b, t, -1, attn.head_dim)).transpose(1, 2)
        v = attn.v_proj(h).view(b, t, -1, attn.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=attn.scaling, enable_gqa=True)
        x = x + attn.o_proj(o.transpose(1, 2).reshape(b, t, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return inner.norm(x)


def _lean_hidden_shared_prefix(model, prefix_ids, suffix_ids, cos, sin):
    """``_lean_hidden`` of rows that all start with ``prefix_ids`` (1, P), for their suffixes (B, S) only: the prefix
    runs once and every suffix attends to its keys and values, as if each row ran whole."""
    import torch
    import torch.nn.functional as F
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    inner = model.model
    (b, s), p = suffix_ids.shape, prefix_ids.shape[1]
    mask = torch.ones(s, p + s, dtype=torch.bool).tril(diagonal=p)  # suffix token i sees prefix and suffix <= i
    xp, xs = inner.embed_tokens(prefix_ids), inner.embed_tokens(suffix_ids)
    for layer in inner.layers:
        attn = layer.self_attn

        def qkv(x, c, n):
            h = layer.input_layernorm(x)
            q = attn.q_norm(attn.q_proj(h).view(x.shape[0], n, -1, attn.head_dim)).transpose(1, 2)
            k = attn.k_norm(attn.k_proj(h).view(x.shape[0], n, -1, attn.head_dim)).transpose(1, 2)
            v = attn.v_proj(h).view(x.shape[0], n, -1, attn.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, *c)
            return q, k, v

        qp, kp, vp = qkv(xp, (cos[:, :p], sin[:, :p]), p)
        qs, ks, vs = qkv(xs, (cos[:, p:p + s], sin[:, p:p + s]), s)
        op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=attn.scaling, enable_gqa=True)
        os_ = F.scaled_dot_product_attention(qs, torch.cat([kp.expand(b, -1, -1, -1), ks], dim=2),
                                             torch.cat([vp.expand(b, -1, -1, -1), vs], dim=2), attn_mask=mask,
                                             scale=attn.scaling, enable_gqa=True)
        xp = xp + attn.o_proj(op.transpose(1, 2).reshape(1, p, -1))
        xp = xp + layer.mlp(layer.post_attention_layernorm(xp))
        xs = xs + attn.o_proj(os_.transpose(1, 2).reshape(b, s, -1))
        xs = xs + layer.mlp(layer.post_attention_layernorm(xs))
    return inner.norm(xs)


# A batch whose rows share this many leading tokens (before anything learnt) runs them once (the "tools" corpus's
# system turn: about 170 tokens); the other corpora's rows share a few tokens at most and run whole.
SHARED_PREFIX_MIN = 64


def _shared_prefix(rows: list[tuple[list[int], list[bool]]]) -> int:
    """Leading tokens common to every row, up to the one before the first learnt token (its prediction comes
    from the suffix then)."""
    first = rows[0][0]
    limit = min(min(len(ids) for ids, _ in rows), min(learn.index(True) if True in learn else len(learn)
                                                      for _, learn in rows) - 1)
    n = 0
    while n < limit and all(ids[n] == first[n] for ids, _ in rows):
        n += 1
    return n


def _rope_tables(model, length: int):
    import torch

    pos = torch.arange(length).unsqueeze(0)
    return model.model.rotary_emb(model.model.embed_tokens.weight[:1, None, :], pos)


def train(model, encoded, p: dict, verbose: bool = False) -> dict:
    """``p["train_steps"]`` AdamW steps on the ``encoded`` rows (warmup, then cosine decay to a tenth of ``p["lr"]``),
    the batches' order seeded by ``p["seed"]``; returns the steps done and the final loss."""
    import torch

    rng = random.Random(p["seed"] + 1)
    batches = _batches(encoded, p["batch_tokens"], rng)
    steps, lr = p["train_steps"], p["lr"]
    warmup = max(1, min(30, steps // 10))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    model.train()
    with torch.no_grad():
        cos, sin = _rope_tables(model, p["max_seq_len"])
    order: list[int] = []
    losses = []
    for step in range(steps):
        if not order:
            order = list(range(len(batches)))
            rng.shuffle(order)
        rows = [encoded[i] for i in batches[order.pop()]]
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.zeros(len(rows), width, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        for r, (ids, learn) in enumerate(rows):
            input_ids[r, :len(ids)] = torch.tensor(ids)
            labels[r, :len(ids)] = torch.where(torch.tensor(learn), torch.tensor(ids), -100)
        # No attention mask: padding is on the right and attention is causal, so real tokens never see it.
        # The LM head runs only where there is a target (answer tokens), which saves a good part of the compute.
        shared = _shared_prefix(rows)
        if shared >= SHARED_PREFIX_MIN:
            hidden = _lean_hidden_shared_prefix(model, input_ids[:1, :shared], input_ids[:, shared:], cos, sin)
            hidden, targets = hidden[:, :-1], labels[:, shared + 1:]
        else:
            hidden = _lean_hidden(model, input_ids, cos, sin)[:, :-1]
            targets = labels[:, 1:]
        keep = targets != -100
        logits = model.lm_head(hidden[keep])
        loss = torch.nn.functional.cross_entropy(logits, targets[keep])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if verbose and (step % 100 == 99 or step == steps - 1):
            recent = losses[-100:]
            print(f"tiny-model: step {step + 1:4d}/{steps}  loss {sum(recent) / len(recent):.3f}", file=sys.stderr)
    tail = losses[-20:]
    return {"train_steps_done": steps, "final_loss": round(sum(tail) / len(tail), 4)}


@contextlib.contextmanager
def torch_threads(n: int | None):
    """Run the block on ``n`` torch threads (None or 0: as many as now), restoring the count afterwards."""
    import torch

    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)
