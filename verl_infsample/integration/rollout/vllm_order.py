"""What ``rollout.name=infinite`` adds to each vLLM request: its place in the plan, its probe, and what the plan
learns when it finishes.

Pure Python (no Ray, no verl, no vLLM): :class:`~.vllm_server.InfiniteVLLMServer` holds one and calls it for every
request it serves, and ``infsample replay`` calls the same object for every request it replays, so the replay's
``infinite`` backend is the product's ordering, not a copy of it.

A request arrives (:meth:`VLLMRequestOrder.arrive`) as one sample of its prompt's group. Where the predictor reads
a sample's tokens (``learned``), the sample first runs as a *probe* of ``probe_tokens`` tokens, ahead of every
planned request; its opening then gives the sample a prediction of its own (:meth:`VLLMRequestOrder.after_probe`),
and the rest of it runs at that prediction's place in the plan. Elsewhere a request runs whole at its group's
prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.predictor import LengthPredictor
from ...core.priority import StepPriorities
from ...core.sample import Group, Sample, prompt_key
from ...predict.features import TokenWindow


@dataclass
class OrderedRequest:
    """One request as the plan sees it: its group, its sample, and the priority it runs at."""

    group: Group
    sample: Sample
    priority: int
    caller: int
    probe: bool  # it runs as a probe first (``probe_tokens``), then its rest at ``after_probe``'s priority


class VLLMRequestOrder:
    """Priorities from ``ordering`` (``core.priority``) over the lengths ``predictor`` predicts; finished lengths go
    back to the predictor."""

    def __init__(self, ordering: str, predictor: LengthPredictor, probe_tokens: int | None = None):
        """``probe_tokens``: the probe's length; None: the predictor's last token checkpoint where it reads tokens,
        else no probe."""
        self.priorities = StepPriorities(ordering)
        self.predictor = predictor
        if probe_tokens is None:
            probe_tokens = max(predictor.token_checkpoints or {0}) if predictor.reads_tokens else 0
        self.probe_tokens = int(probe_tokens)
        self._arrived: dict[str, int] = {}  # prompt key -> samples arrived this step

    def arrive(self, prompt_ids, caller: int = 0, group_size: int = 1, uid: int | None = None,
               true_len: int | None = None, max_tokens: int | None = None, may_probe: bool = True) -> OrderedRequest:
        """A request for ``prompt_ids``: one more sample of its prompt's group this step. ``caller``: the priority
        its sender gave it, which orders what the plan ranks equal. ``group_size``: the samples its group is
        expected to have (GRPO's ``rollout.n``). ``uid``, ``true_len``: a replay's sample number and true length
        (for the ``oracle`` and ``noisy`` predictors); a live request has neither. ``max_tokens``: its budget; one
        no longer than the probe runs whole, as does one that ``may_probe`` not (``probe.probe_refusal``)."""
        key = prompt_key(prompt_ids)
        index = self._arrived.get(key, 0)
        self._arrived[key] = index + 1
        group = Group(key, len(prompt_ids), max(int(group_size), index + 1))
        sample = Sample(uid if uid is not None else index, uid if uid is not None else 0, index, len(prompt_ids),
                        true_len=true_len)
        predicted = sample.predicted_len = self.predictor.predict(group, sample)
        probe = may_probe and self.probe_tokens > 0 and (max_tokens is None or max_tokens > self.probe_tokens)
        if probe:
            priority = self.priorities.probe(key, predicted, caller=caller)
        else:
            priority = self.priorities.of(key, predicted, caller=caller, own=self.predictor.tells_samples_apart)
        return OrderedRequest(group, sample, priority, caller, probe)

    def after_probe(self, request: OrderedRequest, opening: TokenWindow) -> int:
        """The probe of ``request`` decoded ``opening`` and goes on: the priority of its rest, from its own
        prediction."""
        request.sample.generated = len(opening.token_ids)
        self.predictor.observe_tokens(request.group, request.sample, opening)
        request.sample.predicted_len = self.predictor.predict(request.group, request.sample)
        request.priority = self.priorities.of(request.group.prompt_id, request.sample.predicted_len,
                                              caller=request.caller)
        return request.priority

    def finished(self, request: OrderedRequest, length: int) -> str:
        """``request`` completed with ``length`` tokens; returns its prompt's key."""
        self.predictor.observe(request.group, request.sample, length)
        return request.group.prompt_id

    def new_step(self) -> None:
        """A new rollout step (verl's weight sync): its groups are counted afresh."""
        self.priorities.new_step()
        self._arrived.clear()
        self.predictor.start_batch(())
