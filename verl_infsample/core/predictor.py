"""Length predictors: what the scheduler believes about a sample's final length before it has finished.

A spec string picks one: ``oracle``, ``noisy:SIGMA``, ``none``, ``history`` or ``learned[:k=K,...]`` (the online
token-conditioned predictor of ``verl_infsample.predict``, numpy only). Predictions are in tokens; with no
information a predictor answers ``max_len``, the worst case, which is also the safe KV reservation.

Every predictor is a :class:`LengthPredictor`: ``predict`` is its own, and each hook the scheduler and engines
call is a no-op there that a predictor overrides where it learns from it (features are plain numbers, so the core
stays free of tensors). Its flags say which of the costlier hooks it wants called: engines report tokens only to a
predictor that ``reads_tokens``, and the scheduler asks ``predict_outgrown`` only of one that ``repredicts_outgrown``.
"""

from __future__ import annotations

import math

from bisect import bisect_right
from collections import defaultdict, deque
from functools import partial
from itertools import accumulate
from typing import Sequence

import numpy as np

from .sample import Group, Sample


class LengthPredictor:
    """What the scheduler believes of a sample's final length, and the hooks through which it learns."""

    name: str = "predictor"
    reads_tokens: bool = False  # engines report running samples' tokens (``observe_tokens``) at its checkpoints
    repredicts_outgrown: bool = False  # it answers ``predict_outgrown`` (read under a KV budget)
    plans_on_first_token: bool = False  # it asks engines for every sample's first token before the plan
    # before a sample decodes, its prediction is its own (the oracle's and its noisy stand-in's), not its group's
    tells_samples_apart: bool = False
    token_checkpoints: frozenset[int] | None = None  # token counts it reads (None: every token)
    slot_checkpoints: frozenset[int] | None = None  # under M slots, where nothing re-reads a running prediction

    def predict(self, group: Group, sample: Sample) -> float:
        """Predicted final length (tokens) of ``sample`` before it decodes."""
        raise NotImplementedError

    def observe(self, group: Group, sample: Sample, length: int) -> None:
        """A sample finished with ``length`` tokens."""

    def start_batch(self, groups: Sequence[Group]) -> None:
        """A rollout of ``groups`` is about to be planned (the previous one is complete)."""

    def join_batch(self, groups: Sequence[Group]) -> None:
        """``groups`` join the rollout in progress."""

    def observe_prompt(self, prompt_id: str, token_ids: Sequence[int]) -> None:
        """A prompt's tokens, from engines that have them, before the plan."""

    def observe_tokens(self, group: Group, sample: Sample, features) -> bool:
        """A running sample reached one of the checkpoints with these token features; True if its prediction
        changed. Called only where ``reads_tokens``."""
        return False

    def refresh(self, group: Group, sample: Sample) -> None:
        """``sample`` is paused (its probe decoded, its rest not yet started) and about to be ranked again: predict it
        from what is known now (siblings finished since its tokens were read), not from what was known then."""

    def revision(self) -> int:
        """The model's revision, brought up to date with what it has observed (a re-fit where one is due). It
        changes whenever the predictions of paused samples may change beyond their own groups' news: whoever ranks
        paused samples re-predicts them all then, and otherwise only the groups that moved."""
        return 0

    def predict_outgrown(self, group: Group, sample: Sample) -> float:
        """The final length of a running sample that has generated its predicted length and goes on. Called only
        where ``repredicts_outgrown``."""
        raise NotImplementedError(f"{type(self).__name__} does not repredict outgrown samples")


class _Stateless(LengthPredictor):
    pass


class OraclePredictor(_Stateless):
    """The true length (simulators and upper-bound studies only)."""

    name = "oracle"
    tells_samples_apart = True

    def predict(self, group: Group, sample: Sample) -> float:
        if sample.true_len is None:
            raise ValueError("predictor 'oracle' needs true lengths (a trace); use 'history' or 'none' for live rollouts")
        return float(sample.true_len)


class NoisyOraclePredictor(_Stateless):
    """True length times lognormal(0, sigma) noise, seeded per sample so every policy sees the same errors."""

    tells_samples_apart = True

    def __init__(self, sigma: float, seed: int, max_len: int):
        if sigma < 0:
            raise ValueError(f"predictor 'noisy:SIGMA' needs SIGMA >= 0, got {sigma}")
        self.sigma, self.seed, self.max_len = sigma, seed, max_len
        self.name = f"noisy:{sigma:g}"
        self._noise: dict[tuple[int, int], np.ndarray] = {}  # (group, size) -> one independent stream per group

    def predict(self, group: Group, sample: Sample) -> float:
        true = OraclePredictor().predict(group, sample)
        key = (sample.group, group.size)
        if key not in self._noise:
            rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(sample.group,)))
            self._noise[key] = np.exp(self.sigma * rng.standard_normal(group.size))
        return float(min(self.max_len, max(1.0, true * self._noise[key][sample.index])))


class WorstCasePredictor(_Stateless):
    """Every sample runs to its cap (the scheduler clips a prediction to it): what a policy that reads no prediction
    plans and reserves on (``Policy.predictor_for``)."""

    name = "-"

    def predict(self, group: Group, sample: Sample) -> float:
        return math.inf


class NoInformationPredictor(_Stateless):
    """Knows nothing: every sample may run to ``max_len``."""

    name = "none"

    def __init__(self, max_len: int):
        self.max_len = max_len

    def predict(self, group: Group, sample: Sample) -> float:
        return float(self.max_len)


class HistoryPredictor(LengthPredictor):
    """Per-prompt running mean of earlier rollouts, else the global mean, else ``max_len``.

    GRPO revisits prompts across epochs, and a prompt's lengths correlate strongly from one visit to the next. A
    sample that outgrows its prediction is predicted the mean of earlier rollouts' lengths beyond what it has
    generated (its prompt's, else all prompts'), not to end at the next step: long-tailed lengths (a runaway answer)
    keep going, and admitting as if they ended at once overcommits the KV and preempts. Those lengths join the pool
    only when their rollout is complete (``start_batch``): the samples that finish first are the short ones, so a
    rollout in progress would bias it short.
    """

    name = "history"
    repredicts_outgrown = True
    KEPT_PER_PROMPT = 256  # lengths kept per prompt (and 16x that over all prompts) for ``predict_outgrown``

    def __init__(self, max_len: int):
        self.max_len = max_len
        self._sum: dict[str, float] = defaultdict(float)
        self._count: dict[str, int] = defaultdict(int)
        self._global_sum, self._global_count = 0.0, 0
        self._lengths: dict[str, deque[int]] = defaultdict(partial(deque, maxlen=self.KEPT_PER_PROMPT))
        self._all_lengths: deque[int] = deque(maxlen=16 * self.KEPT_PER_PROMPT)
        self._this_batch: dict[str, list[int]] = defaultdict(list)  # finished in the rollout in progress
        # a pool's lengths sorted, with suffix sums, for ``predict_outgrown`` (read every step under a KV budget;
        # the pools change only between rollouts): prompt id (None: all prompts) -> (sorted, suffix sums), plain
        # lists: a lookup is a bisection and a division, not a few numpy calls
        self._tails: dict[str | None, tuple[list[int], list[int]]] = {}

    def predict(self, group: Group, sample: Sample) -> float:
        if self._count.get(group.prompt_id):
            return self._sum[group.prompt_id] / self._count[group.prompt_id]
        if self._global_count:
            return self._global_sum / self._global_count
        return float(self.max_len)

    def observe(self, group: Group, sample: Sample, length: int) -> None:
        self._sum[group.prompt_id] += length
        self._count[group.prompt_id] += 1
        self._global_sum += length
        self._global_count += 1
        self._this_batch[group.prompt_id].append(length)

    def start_batch(self, groups) -> None:
        """The previous rollout is complete: its lengths join the pools, at most the pool's size of them per prompt
        (and 16x over all), evenly spread over their sorted values so that the pool keeps their distribution."""
        if not self._this_batch:
            return
        for prompt_id, lengths in self._this_batch.items():
            self._lengths[prompt_id].extend(_spread(lengths, self.KEPT_PER_PROMPT))
        self._all_lengths.extend(_spread([n for ls in self._this_batch.values() for n in ls],
                                         self._all_lengths.maxlen))
        self._this_batch.clear()
        self._tails.clear()

    def state(self) -> dict:
        """What ``load_state`` restores (plain JSON types): the means' sums and the kept lengths."""
        return {"sum": dict(self._sum), "count": dict(self._count), "global_sum": self._global_sum,
                "global_count": self._global_count, "lengths": {k: list(v) for k, v in self._lengths.items()},
                "all_lengths": list(self._all_lengths)}

    def load_state(self, state: dict) -> None:
        self._sum.update(state["sum"])
        self._count.update(state["count"])
        self._global_sum, self._global_count = state["global_sum"], state["global_count"]
        for prompt_id, lengths in state.get("lengths", {}).items():  # (older saved states have none)
            self._lengths[prompt_id].extend(lengths)
        self._all_lengths.extend(state.get("all_lengths", []))
        self._tails.clear()

    def predict_outgrown(self, group: Group, sample: Sample) -> float:
        """Mean of the kept lengths beyond ``sample.generated`` (its prompt's, else all), else ``max_len``."""
        for key in (group.prompt_id, None):
            lengths, suffix = self._tail(key)
            first = bisect_right(lengths, sample.generated)  # the first one longer
            if first < len(lengths):
                return float(suffix[first] / (len(lengths) - first))
        return float(self.max_len)

    def _tail(self, key: str | None) -> tuple[list[int], list[int]]:
        """Pool ``key``'s lengths sorted and their suffix sums (exact integers), built once per rollout."""
        if key not in self._tails:
            lengths = sorted(self._all_lengths if key is None else self._lengths.get(key, ()))
            suffix = list(accumulate(reversed(lengths)))[::-1]
            self._tails[key] = (lengths, suffix)
        return self._tails[key]


def _spread(values: list[int], k: int) -> list[int]:
    """At most ``k`` of ``values``, evenly spaced over their sorted order (a size-``k`` summary of their spread)."""
    ordered = sorted(values)
    if len(ordered) <= k:
        return ordered
    return [ordered[(2 * i + 1) * len(ordered) // (2 * k)] for i in range(k)]
