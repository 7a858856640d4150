"""What ``rollout.name=infinite`` adds to each vLLM request: its priority in the plan, and what the plan learns when
it finishes.

Pure Python (no Ray, no verl, no vLLM): :class:`~.vllm_server.InfiniteVLLMServer` holds one and calls it for every
request it serves, and ``infsample replay`` calls the same object for every request it replays, so the replay's
``infinite`` backend is the product's ordering, not a copy of it.
"""

from __future__ import annotations

from ...core.predictor import LengthPredictor
from ...core.priority import StepPriorities
from ...core.sample import Group, Sample, prompt_key


class VLLMRequestOrder:
    """Priorities from ``ordering`` (``core.priority``) over the lengths ``predictor`` predicts for each request's
    prompt; finished lengths go back to the predictor."""

    def __init__(self, ordering: str, predictor: LengthPredictor):
        self.priorities = StepPriorities(ordering)
        self.predictor = predictor

    def priority(self, prompt_ids, caller: int = 0, sample: Sample | None = None) -> int:
        """The vLLM priority of a request for ``prompt_ids`` (lower runs first). ``caller``: the priority its sender
        gave it, which orders what the plan ranks equal. ``sample``: what is known of the sample beyond its prompt
        (a replay's true length for the ``oracle`` and ``noisy`` predictors); a live request has only its prompt."""
        group = Group(prompt_key(prompt_ids), len(prompt_ids), 1)
        sample = sample or Sample(0, 0, 0, group.prompt_len)
        return self.priorities.of(group.prompt_id, self.predictor.predict(group, sample), caller=caller)

    def finished(self, prompt_ids, length: int) -> str:
        """A request for ``prompt_ids`` completed with ``length`` tokens; returns its prompt's key."""
        group = Group(prompt_key(prompt_ids), len(prompt_ids), 1)
        self.predictor.observe(group, Sample(0, 0, 0, group.prompt_len), length)
        return group.prompt_id

    def new_step(self) -> None:
        """A new rollout step (verl's weight sync): its groups are counted afresh."""
        self.priorities.new_step()
        self.predictor.start_batch(())
