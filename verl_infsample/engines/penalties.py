"""vLLM's history-dependent sampling rules on a step's logits: ``min_tokens`` and the repetition, presence and
frequency penalties.

They read each sample's own prompt and tokens so far, nothing of the batch, so a row's token still depends only on
its own logits, history and random stream: sampling stays schedule-invariant. Applied to the raw logits before either
sampler draws (``sampling`` on the host, ``torch_sampling`` on the device), in vLLM's order: the logit bias and stop
tokens banned below ``min_tokens``, then repetition (prompt and response tokens), then presence and frequency
(response tokens); the sampler then applies the rest (``sampler_params``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from .sampling import SamplingParams


def apply_penalties(logits: torch.Tensor, params: SamplingParams, prompts: Sequence[torch.Tensor],
                    responses: Sequence[Sequence[int]]) -> torch.Tensor:
    """``logits`` [B, V] (any dtype, any device) with ``params``' history rules and logit bias applied, as float32;
    row b's prompt is ``prompts[b]`` (token ids) and its response so far ``responses[b]``. Returns ``logits`` itself
    when ``params`` reads no history (the sampler adds the bias then)."""
    if not params.reads_history:
        return logits
    x = logits.to(torch.float32, copy=True)
    device, (rows, vocab) = x.device, x.shape
    for token, bias in params.logit_bias:
        x[:, token] += bias
    if params.min_tokens and params.stop_token_ids:
        short = [b for b, r in enumerate(responses) if len(r) < params.min_tokens]
        if short:
            x[torch.tensor(short, device=device)[:, None], torch.tensor(params.stop_token_ids, device=device)] = -torch.inf
    if params.repetition_penalty == 1.0 and not params.presence_penalty and not params.frequency_penalty:
        return x
    counts = torch.zeros(rows, vocab, dtype=torch.float32, device=device)
    row_of = torch.repeat_interleave(torch.arange(rows), torch.tensor([len(r) for r in responses]))
    tokens = torch.tensor([t for r in responses for t in r], dtype=torch.long)
    counts.index_put_((row_of.to(device), tokens.to(device)), torch.ones(len(tokens), device=device), accumulate=True)
    if params.repetition_penalty != 1.0:
        seen = counts > 0
        prompt_row = torch.repeat_interleave(torch.arange(rows), torch.tensor([len(p) for p in prompts]))
        seen[prompt_row.to(device), torch.cat([torch.as_tensor(p) for p in prompts]).long().to(device)] = True
        penalised = torch.where(x > 0, x / params.repetition_penalty, x * params.repetition_penalty)
        x = torch.where(seen, penalised, x)
    if params.frequency_penalty:
        x -= params.frequency_penalty * counts
    if params.presence_penalty:
        x -= params.presence_penalty * (counts > 0).float()
    return x


def sampler_params(params: SamplingParams) -> SamplingParams:
    """The parameters the sampler draws with after ``apply_penalties``: all of ``params``, less the logit bias where
    ``apply_penalties`` added it already."""
    return replace(params, logit_bias=()) if params.reads_history else params
