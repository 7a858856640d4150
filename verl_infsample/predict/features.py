"""What the learned predictor looks at: plain numbers an engine already has, turned into one feature vector.

When a running sample reaches one of the predictor's checkpoints (k generated tokens) the engine reports a
``TokenWindow``: its token ids and their log-probs (which it keeps anyway), the entropy of the distribution the last
token was drawn from and that distribution's mass on the stop tokens. Nothing is computed on the other steps.
Engines without logits (a trace of token ids) pass None / NaN there. ``feature_vector`` builds the regressor's input
from the prompt, the sample's tokens so far, its group's finished siblings and the prompt's history, and what earlier
samples that began with the same tokens went on to generate (the predictor keeps those means: ``prefix_log_len``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

PROMPT_BUCKETS = 32  # hashed unigrams + bigrams of the prompt's token ids
TOKEN_BUCKETS = 16  # hashed unigrams of the generated tokens
EOS_FLOOR = -20.0  # log-probs of stopping below this carry no more information


class TokenWindow(NamedTuple):
    """A sample's tokens so far, as plain numbers: what an engine reports when it reaches a checkpoint."""

    token_ids: Sequence[int]  # every generated id so far
    logprobs: Sequence[float] | None = None  # of each drawn token (None: the engine has no logits)
    entropy: float = math.nan  # entropy (nats) of the distribution the last token was drawn from
    stop_logprob: float = math.nan  # log of that distribution's mass on the stop tokens


def _bucket(token: int, buckets: int) -> int:
    return (token * 2654435761) % buckets  # Knuth's multiplicative hash: cheap and spreads consecutive ids


def prompt_vector(token_ids: Sequence[int]) -> np.ndarray:
    """Hashed unigram and bigram counts of the prompt, L2-normalised: which task it is, roughly how big."""
    v = np.zeros(PROMPT_BUCKETS)
    prev = None
    for t in token_ids:
        v[_bucket(int(t), PROMPT_BUCKETS)] += 1.0
        if prev is not None:
            v[_bucket(prev * 1_000_003 + int(t), PROMPT_BUCKETS)] += 1.0
        prev = int(t)
    norm = np.linalg.norm(v)
    return v / norm if norm else v


@dataclass
class GroupContext:
    """What is known about a sample's group when it is predicted: finished siblings and the prompt's history."""

    size: int
    prompt_len: int
    prompt: np.ndarray | None  # ``prompt_vector`` of its token ids, None if the engine gave none
    finished: int = 0
    finished_log_len_sum: float = 0.0
    history_log_len: float | None = None  # mean log length of this prompt in earlier rollouts
    waiting: tuple | None = None  # (finished count, features, prediction) shared by its samples not yet started
    blank: tuple | None = None  # (finished count, features with no token yet): every sample's k = 0 snapshot


# layout of the feature vector
_TOKEN_SCALARS = 6
_SIBLINGS = 1 + 1 + PROMPT_BUCKETS + 1 + 2  # where the 3 sibling features start
DIM = _SIBLINGS + 3 + _TOKEN_SCALARS + TOKEN_BUCKETS + 2


def feature_vector(ctx: GroupContext, window: TokenWindow | None, prefix_log_len: float | None = None) -> np.ndarray:
    """The regressor's input (``DIM`` numbers); token features are zero before the first token. ``prefix_log_len``:
    mean log remaining length of earlier samples that began with the same tokens, at the same checkpoint (a
    hashed bag of tokens mixes ids in its buckets; this keeps the opening's own track record, e.g. "Let me think
    step by step" vs a one-word answer)."""
    x = np.zeros(DIM)
    x[0] = 1.0
    x[1] = math.log1p(ctx.prompt_len) / 5.0
    i = 2
    if ctx.prompt is not None:
        x[i:i + PROMPT_BUCKETS] = ctx.prompt
    i += PROMPT_BUCKETS
    x[i] = ctx.prompt is not None
    i += 1
    if ctx.history_log_len is not None:
        x[i], x[i + 1] = 1.0, ctx.history_log_len / 5.0
    _set_siblings(x, ctx)
    i = _SIBLINGS + 3
    if window is not None and window.token_ids:
        n = len(window.token_ids)
        x[i] = math.log1p(n) / 5.0
        if window.logprobs is not None:
            x[i + 1] = sum(window.logprobs) / n
            x[i + 2] = min(window.logprobs)
        if window.entropy == window.entropy:  # not NaN: the engine has logits
            x[i + 3] = 1.0
            x[i + 4] = window.entropy
            x[i + 5] = max(EOS_FLOOR, window.stop_logprob) / 10.0
        i += _TOKEN_SCALARS
        for t in window.token_ids:
            x[i + _bucket(t, TOKEN_BUCKETS)] += 1.0 / n
    i = DIM - 2
    if prefix_log_len is not None:
        x[i], x[i + 1] = 1.0, prefix_log_len / 5.0
    return x


def with_siblings(x: np.ndarray, ctx: GroupContext) -> np.ndarray:
    """A copy of ``feature_vector``'s output with the sibling features as of ``ctx`` now: a sample that has not
    started keeps its first-token features while its siblings finish, and this refreshes them without rebuilding
    the rest."""
    x = x.copy()
    _set_siblings(x, ctx)
    return x


def _set_siblings(x: np.ndarray, ctx: GroupContext) -> None:
    i = _SIBLINGS
    if ctx.finished:
        x[i] = 1.0
        x[i + 1] = ctx.finished_log_len_sum / ctx.finished / 5.0
        x[i + 2] = ctx.finished / ctx.size
    else:
        x[i:i + 3] = 0.0
