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
    """vLLM's sampling parameters that a rollout honours, with vLLM's meaning and checks."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: off
    min_p: float = 0.0  # keep tokens with probability >= min_p x the most likely one's
    max_new_tokens: int = 128
    min_tokens: int = 0  # no stop token before this many tokens
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0
    logprobs: bool = True
    # ((token id, bias), ...) added to those logits before sampling (vLLM's ``logit_bias``), e.g. on eos to move
    # the length distribution
    logit_bias: tuple[tuple[int, float], ...] = ()
    # on the logits, before temperature, from the sample's own tokens (``penalties``): tokens of the prompt or the
    # response have positive logits divided by repetition_penalty and negative ones multiplied; every token of the
    # response loses presence_penalty once and frequency_penalty per occurrence
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 0, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.min_tokens <= self.max_new_tokens:
            raise ValueError(f"min_tokens must be in [0, max_new_tokens={self.max_new_tokens}], got {self.min_tokens}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}")
        for key in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, key) <= 2:
                raise ValueError(f"{key} must be in [-2, 2] (0 = off), got {getattr(self, key)}")

    @property
    def reads_history(self) -> bool:
        """Whether a token's distribution depends on the sample's own tokens so far (``penalties``)."""
        return bool(self.min_tokens) or self.repetition_penalty != 1.0 or bool(self.presence_penalty) or bool(
            self.frequency_penalty)


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
    logp, keep = _distribution(logits, params)
    if keep is None:  # greedy
        tokens = np.argmax(logp, axis=1)
    else:
        tokens = _gumbel_max(logp, keep, rngs)
    out = tokens, np.take_along_axis(logp, tokens[:, None], 1)[:, 0]
    return (*out, logp) if with_logp else out


def sample_shared(logits: np.ndarray, params: SamplingParams, rngs: list[np.random.Generator]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One token per stream in ``rngs``, all drawn from the same row of ``logits`` [V] (a group's prompt logits):
    exactly the tokens ``sample_tokens`` draws from that row repeated, with the distribution computed once.
    Returns (tokens, log-probs, the [1, V] log-probs drawn from)."""
    logp, keep = _distribution(np.asarray(logits)[None, :], params)
    if keep is None:
        tokens = np.full(len(rngs), int(np.argmax(logp[0])))
    else:
        tokens = _gumbel_max(logp, keep, rngs)
    return tokens, logp[0, tokens], logp


def _distribution(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows of ``logits`` [B, V] -> (log-probs drawn from, in float64; the tokens top-k / top-p keep, None when
    greedy)."""
    logits = apply_logit_bias(logits.astype(np.float64), params)
    if params.temperature == 0:
        return _log_softmax(logits), None
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
    if params.min_p > 0:  # log p >= log(min_p) + the row's largest log p
        keep &= logp >= np.log(params.min_p) + logp.max(axis=1, keepdims=True)
    return logp, keep


def _gumbel_max(logp: np.ndarray, keep: np.ndarray, rngs: list[np.random.Generator]) -> np.ndarray:
    """argmax of log p + Gumbel noise over the kept tokens, one row of noise per stream (``logp`` / ``keep`` are
    [B, V], or [1, V] shared by every stream)."""
    noise = np.stack([rng.gumbel(size=logp.shape[1]) for rng in rngs])  # each stream advances one vocab per token
    return np.argmax(np.where(keep, logp + noise, -np.inf), axis=1)


def distribution_stats(logp: np.ndarray, stop_token_ids) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``logp`` [B, V] (the log-probs tokens are drawn from, ``sample_tokens(with_logp=True)``): its
    entropy (nats) and the log of its mass on the stop tokens (-inf without stop tokens; at least log(1e-300)).
    What a length predictor reads; computed only for the rows at a predictor checkpoint, from what sampling
    already has, in few numpy calls (the rows are few: the calls, not the arithmetic, are the cost)."""
    p = np.exp(logp)
    entropy = -np.einsum("ij,ij->i", p, np.where(p > 0, logp, 0.0))  # (a token banned by min_tokens has log p -inf)
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
