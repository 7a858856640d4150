"""What the learned predictor looks at: plain numbers an engine already has, turned into one feature vector.

When a running sample reaches one of the predictor's checkpoints (k generated tokens) the engine reports a
``TokenWindow``: its token ids and their log-probs (which it keeps anyway), the entropy of the distribution the last
token was drawn from and that distribution's mass on the stop tokens. Nothing is computed on the other steps.
Engines without logits (a trace of token ids) pass None / NaN there. ``feature_rows`` builds the regressor's inputs
from the prompt, the sample's tokens so far, its group's finished siblings and the prompt's history, and what earlier
samples that began with the same tokens went on to generate (the predictor keeps those means: ``prefix_log_len``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
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
    siblings: tuple[float, float, float] = (0.0, 0.0, 0.0)  # the 3 sibling features as of ``finished``
    waiting: tuple | None = None  # (finished count, siblings, prediction) shared by its samples not yet started
    base: np.ndarray | None = None  # ``group_features``: built once per batch
    dots: dict = field(default_factory=dict)  # the predictor's: checkpoint -> (regressor version, w . base)

    def sibling_finished(self, log_length: float) -> None:
        """A sample of the group finished with exp(``log_length``) tokens: the sibling features move."""
        self.finished += 1
        self.finished_log_len_sum += log_length
        self.siblings = (1.0, self.finished_log_len_sum / self.finished / 5.0, self.finished / self.size)


# layout of the feature vector: the group's features | 3 sibling features | the sample's own (token) features
_TOKEN_SCALARS = 6
SIBLINGS = 1 + 1 + PROMPT_BUCKETS + 1 + 2  # where the sibling features start
TOKENS = SIBLINGS + 3  # where the sample's own start
DIM = TOKENS + _TOKEN_SCALARS + TOKEN_BUCKETS + 2
NO_TOKENS = (0.0,) * (DIM - TOKENS)  # a sample's own features before its first token


def feature_rows(contexts: Sequence[GroupContext], siblings: Sequence[tuple], own: Sequence[Sequence[float]]
                 ) -> np.ndarray:
    """The regressor's inputs [n, DIM], built when it learns from them: sample i's group features
    (``contexts[i]``), its sibling features and its own (``token_features``). A prediction needs no such row: it
    adds the three parts' products with the weights (the group's once per group and solve, the siblings' 3, the
    sample's over a short plain list), so a waiting sample's refresh when a sibling finishes costs 3 products."""
    x = np.array([group_features(ctx) for ctx in contexts])
    x[:, SIBLINGS:TOKENS] = siblings
    x[:, TOKENS:] = own
    return x


def group_features(ctx: GroupContext) -> np.ndarray:
    """The features every sample of the group shares (bias, prompt length and tokens, the prompt's history; no
    sibling or token features), built once per batch and shared: never write to it."""
    if ctx.base is None:
        x = np.zeros(DIM)
        x[0] = 1.0
        x[1] = math.log1p(ctx.prompt_len) / 5.0
        if ctx.prompt is not None:
            x[2:2 + PROMPT_BUCKETS] = ctx.prompt
            x[2 + PROMPT_BUCKETS] = 1.0
        if ctx.history_log_len is not None:
            x[SIBLINGS - 2], x[SIBLINGS - 1] = 1.0, ctx.history_log_len / 5.0
        ctx.base = x
    return ctx.base


def token_features(window: TokenWindow | None, prefix_log_len: float | None) -> list[float]:
    """The sample's own part of the features (the last ``DIM - TOKENS`` numbers) as a plain list: its tokens
    so far (0 before the first) and ``prefix_log_len``, the mean log remaining length of earlier samples that began
    with the same tokens, at the same checkpoint (a hashed bag of tokens mixes ids in its buckets; this keeps the
    opening's own track record, e.g. "Let me think step by step" vs a one-word answer)."""
    block = list(NO_TOKENS)
    if window is not None and window.token_ids:
        n = len(window.token_ids)
        lp = window.logprobs
        block[0] = math.log1p(n) / 5.0
        if lp is not None:
            block[1], block[2] = sum(lp) / n, min(lp)
        if window.entropy == window.entropy:  # not NaN: the engine has logits
            block[3], block[4], block[5] = 1.0, window.entropy, max(EOS_FLOOR, window.stop_logprob) / 10.0
        for t in window.token_ids:
            block[_TOKEN_SCALARS + _bucket(t, TOKEN_BUCKETS)] += 1.0 / n
    if prefix_log_len is not None:
        block[-2], block[-1] = 1.0, prefix_log_len / 5.0
    return block
