"""Sampling that does not depend on the schedule.

Each sample draws from its own random stream, keyed by (seed, prompt id, sample index), and picks its token by the
Gumbel-max trick: argmax over the vocabulary of log p + Gumbel noise, one noise value per vocabulary entry per
token, all in float64 on its own row. So the same seed gives the same tokens whatever the policy, slot count or
batch composition; with temperature 0 it is greedy argmax, as HF does.

Why Gumbel-max and not inverse-CDF sampling: a different batch composition perturbs logits in the last bits
(matmul blocking, padding). Inverse CDF flips a token when the uniform lands within that perturbation of a
cumulative boundary, which for low-probability tokens happens about once per thousand tokens; Gumbel-max flips only
when the two best perturbed scores are within it, about once per million.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: off
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0
    logprobs: bool = True
    # ((token id, bias), ...) added to those logits before sampling (vLLM's ``logit_bias``), e.g. on eos to move
    # the length distribution
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


def sample_stream(seed: int, prompt_id: str, index: int) -> np.random.Generator:
    """The random stream of one sample: independent of every other sample and of the order they are decoded in."""
    digest = hashlib.blake2b(prompt_id.encode(), digest_size=8).digest()
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, int.from_bytes(digest, "little"), index])))


def sample_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> tuple[int, float]:
    """One token from one row of logits, and its log-prob under the temperature-scaled distribution."""
    tokens, logprobs = sample_tokens(np.asarray(logits)[None, :], params, [rng])
    return int(tokens[0]), float(logprobs[0])


def sample_tokens(logits: np.ndarray, params: SamplingParams, rngs: list[np.random.Generator], *,
                  with_logp: bool = False) -> tuple[np.ndarray, ...]:
    """One token per row of ``logits`` [B, V], row b drawn from ``rngs[b]``; returns (tokens, log-probs), and with
    ``with_logp`` the [B, V] log-probs of the distribution drawn from (before top-k / top-p), for
    ``distribution_stats``.

    Rows are independent: the same row gives the same token whatever else is in the batch.
    """
    logits = apply_logit_bias(logits.astype(np.float64), params)
    if params.temperature == 0:
        tokens = np.argmax(logits, axis=1)
        logp = _log_softmax(logits)
        out = tokens, np.take_along_axis(logp, tokens[:, None], 1)[:, 0]
        return (*out, logp) if with_logp else out
    logp = _log_softmax(logits / params.temperature)
    vocab = logp.shape[1]
    keep = np.ones_like(logp, dtype=bool)
    if 0 < params.top_k < vocab:
        kth = np.partition(logp, -params.top_k, axis=1)[:, -params.top_k][:, None]
        keep &= logp >= kth
    if params.top_p < 1.0:
        order = np.argsort(-logp, axis=1, kind="stable")
        mass = np.cumsum(np.exp(np.take_along_axis(logp, order, 1)), axis=1)
        cut = (mass < params.top_p).sum(axis=1) + 1  # smallest prefix with mass >= top_p
        nucleus = np.zeros_like(keep)
        np.put_along_axis(nucleus, order, np.arange(vocab)[None, :] < cut[:, None], 1)
        keep &= nucleus
    noise = np.stack([rng.gumbel(size=vocab) for rng in rngs])  # each stream advances by one vocab per token
    tokens = np.argmax(np.where(keep, logp + noise, -np.inf), axis=1)
    out = tokens, np.take_along_axis(logp, tokens[:, None], 1)[:, 0]
    return (*out, logp) if with_logp else out


def distribution_stats(logp: np.ndarray, stop_token_ids) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``logp`` [B, V] (the log-probs tokens are drawn from, ``sample_tokens(with_logp=True)``): its
    entropy (nats) and the log of its mass on the stop tokens (-inf without stop tokens; at least log(1e-300)).
    What a length predictor reads; computed only for the rows at a predictor checkpoint, from what sampling
    already has, in few numpy calls (the rows are few: the calls, not the arithmetic, are the cost)."""
    p = np.exp(logp)
    entropy = -np.einsum("ij,ij->i", p, logp)
    stop = list(stop_token_ids)
    if not stop:
        return entropy, np.full(len(logp), -np.inf)
    return entropy, np.log(np.maximum(p[:, stop].sum(axis=1), 1e-300))


def apply_logit_bias(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """``logits`` [B, V] with ``params.logit_bias`` added (a copy when there is a bias; the input otherwise)."""
    if not params.logit_bias:
        return logits
    logits = logits.copy()
    for token, bias in params.logit_bias:
        logits[:, token] += bias
    return logits


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
