"""Schedule-invariant sampling on the model's device (a GPU): the numpy sampler's rules, without the copy to the host.

``sampling.py`` draws each token on the host in float64 from a per-sample numpy stream. With a real vocabulary
(Qwen3: 151,936 ids) and hundreds of rows a step, that is seconds per step on a CPU, and every step copies the
[rows, vocab] logits off the GPU. Here the same Gumbel-max rule runs on the device, in float64, with noise from a
counter-based hash instead of a stateful stream: the noise of vocabulary entry v for a sample's t-th token is
splitmix64(splitmix64(key + t * golden) + (v + 1) * golden), where key is fixed by (seed, prompt id, sample index).
A row's token depends only on its own logits, key and t, never on the batch, so the same seed gives the same tokens
under every policy, slot count and KV budget on a device (tested on the CPU, where int64 arithmetic wraps the
same way; a different sampler than numpy's, so its tokens differ from the numpy sampler's).

``CounterStream`` keeps ``t``: one draw per token, exactly as a numpy ``Generator`` advances one vocabulary of noise
per token, so the engine treats both kinds of stream alike (the first-token lookahead draws t = 0 before the plan).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from .sampling import SamplingParams

def _i64(c: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN = _i64(0x9E3779B97F4A7C15)
_MIX1 = _i64(0xBF58476D1CE4E5B9)
_MIX2 = _i64(0x94D049BB133111EB)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` is arithmetic: it copies the sign bit)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _splitmix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (multiplication wraps modulo 2^64)."""
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


class CounterStream:
    """A sample's noise: ``key`` from (seed, prompt id, index), ``t`` its next token's position."""

    __slots__ = ("key", "t")

    def __init__(self, key: int, t: int = 0):
        self.key, self.t = key, t


def counter_stream(seed: int, prompt_id: str, index: int) -> CounterStream:
    digest = hashlib.blake2b(f"{seed}\x00{prompt_id}\x00{index}".encode(), digest_size=8).digest()
    return CounterStream(int.from_bytes(digest, "little", signed=True))


def _advance(streams: list[CounterStream]) -> None:
    """Each stream drew its token: the next draw is at the next position."""
    for s in streams:
        s.t += 1


def uniforms(streams: list[CounterStream], vocab: int, device) -> torch.Tensor:
    """[len(streams), vocab] float64 uniforms in (0, 1) for each stream's current token; advances no stream."""
    keys = torch.tensor([s.key for s in streams], dtype=torch.int64, device=device)
    ts = torch.tensor([s.t for s in streams], dtype=torch.int64, device=device)
    row = _splitmix64(keys + ts * _GOLDEN)
    ids = (torch.arange(vocab, dtype=torch.int64, device=device) + 1) * _GOLDEN
    bits = _shr(_splitmix64(row[:, None] + ids[None, :]), 11)  # 53 random bits
    return (bits.to(torch.float64) + 0.5) * 2.0 ** -53


def distribution(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows of ``logits`` [B, V] -> (float64 log-probs drawn from; the tokens top-k / top-p keep, None when greedy):
    ``sampling._distribution`` on the device."""
    x = logits.to(torch.float64)
    if params.logit_bias:
        x = x.clone()
        for token, bias in params.logit_bias:
            x[:, token] += bias
    if params.temperature == 0:
        return torch.log_softmax(x, dim=-1), None
    logp = torch.log_softmax(x / params.temperature, dim=-1)
    vocab = logp.shape[1]
    keep = torch.ones_like(logp, dtype=torch.bool)
    if 0 < params.top_k < vocab:
        kth = torch.topk(logp, params.top_k, dim=1).values[:, -1:]
        keep &= logp >= kth
    if params.top_p < 1.0:
        order = torch.argsort(-logp, dim=1, stable=True)
        mass = torch.cumsum(torch.exp(torch.gather(logp, 1, order)), dim=1)
        cut = (mass < params.top_p).sum(dim=1, keepdim=True) + 1  # smallest prefix with mass >= top_p
        nucleus = torch.zeros_like(keep)
        nucleus.scatter_(1, order, torch.arange(vocab, device=logp.device)[None, :] < cut)
        keep &= nucleus
    if params.min_p > 0:  # log p >= log(min_p) + the row's largest log p
        keep &= logp >= np.log(params.min_p) + logp.max(dim=1, keepdim=True).values
    return logp, keep


def _gumbel_max(logp: torch.Tensor, keep: torch.Tensor, streams: list[CounterStream]) -> torch.Tensor:
    """argmax of log p + Gumbel noise over the kept tokens, row b's noise from ``streams[b]`` (``logp`` / ``keep``
    [B, V], or [1, V] shared by every stream); advances each stream by one token. Its temporaries are [B, V]: the
    engine draws in chunks of rows (``transformers_engine._SAMPLE_ROWS``) to bound them."""
    gumbel = -torch.log(-torch.log(uniforms(streams, logp.shape[1], logp.device)))
    scores = torch.where(keep, logp + gumbel, torch.tensor(-torch.inf, dtype=logp.dtype, device=logp.device))
    _advance(streams)
    return torch.argmax(scores, dim=1)


def sample_tokens(logits: torch.Tensor, params: SamplingParams, streams: list[CounterStream], *,
                  with_logp: bool = False):
    """One token per row of ``logits`` [B, V] (on any device): (tokens, log-probs) as numpy arrays, and with
    ``with_logp`` the [B, V] log-probs drawn from (on the device, for ``distribution_stats``)."""
    logp, keep = distribution(logits, params)
    if keep is None:
        tokens = torch.argmax(logp, dim=1)
        _advance(streams)
    else:
        tokens = _gumbel_max(logp, keep, streams)
    chosen = torch.gather(logp, 1, tokens[:, None])[:, 0]
    out = tokens.cpu().numpy(), chosen.cpu().numpy()
    return (*out, logp) if with_logp else out


def sample_shared(logits: torch.Tensor, params: SamplingParams, streams: list[CounterStream]):
    """One token per stream, all drawn from the one row ``logits`` [V] (a group's prompt logits): the tokens
    ``sample_tokens`` draws from that row repeated. Returns (tokens, log-probs, the [1, V] log-probs drawn from)."""
    logp, keep = distribution(logits[None, :], params)
    if keep is None:
        tokens = torch.argmax(logp[0]).repeat(len(streams))
        _advance(streams)
    else:
        tokens = _gumbel_max(logp, keep, streams)
    return tokens.cpu().numpy(), logp[0, tokens].cpu().numpy(), logp


def distribution_stats(logp: torch.Tensor, stop_token_ids) -> tuple[np.ndarray, np.ndarray]:
    """``sampling.distribution_stats`` on the device: per row, entropy (nats) and log of the mass on the stop
    tokens, as numpy arrays."""
    p = torch.exp(logp)
    entropy = -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(dim=1)
    stop = list(stop_token_ids)
    if not stop:
        return entropy.cpu().numpy(), np.full(len(logp), -np.inf)
    mass = torch.clamp(p[:, stop].sum(dim=1), min=1e-300)
    return entropy.cpu().numpy(), torch.log(mass).cpu().numpy()
