"""A trace's per-sample prediction, revealed where the product would have it: after the sample's probe.

``--predictor noisy:SIGMA`` (or ``oracle``) stands in for a token-conditioned predictor of that error. On vLLM the
product learns a sample's own prediction from its probe (``integration.rollout.vllm.order``), so before its probe
a sample is predicted as its prompt's history says, and from its probe on as the trace's prediction says.
"""

from __future__ import annotations

from verl_infsample.core.predictor import HistoryPredictor, LengthPredictor
from verl_infsample.core.sample import Group, Sample


class RevealedByProbe(LengthPredictor):
    """``revealed``'s prediction of a sample once it has been probed (``probe_tokens`` tokens seen), ``history``'s
    before."""

    reads_tokens = True

    def __init__(self, revealed: LengthPredictor, probe_tokens: int, max_len: int):
        if probe_tokens < 1:
            raise ValueError(f"--probe-tokens must be >= 1 to reveal a prediction after the probe, got {probe_tokens}")
        self.revealed = revealed
        self.history = HistoryPredictor(max_len)
        self.token_checkpoints = frozenset({probe_tokens})
        self.name = revealed.name
        self._probed: set[int] = set()  # uids of the samples probed this step

    def predict(self, group: Group, sample: Sample) -> float:
        if sample.uid in self._probed:
            return self.revealed.predict(group, sample)
        return self.history.predict(group, sample)

    def observe_tokens(self, group: Group, sample: Sample, features) -> bool:
        self._probed.add(sample.uid)
        return True

    def observe(self, group: Group, sample: Sample, length: int) -> None:
        self.history.observe(group, sample, length)
        self._probed.discard(sample.uid)

    def start_batch(self, groups) -> None:
        self.history.start_batch(groups)
        self._probed.clear()
