"""The plan as request priorities, for an engine that schedules by itself (vLLM, ``scheduling_policy=priority``).

Each ordering is an object (``make_ordering`` by name) that ranks a request and says what vLLM should keep free.

vLLM admits waiting requests by (priority, arrival), lowest first, refills a freed slot at once, shares a prompt's
KV blocks through its prefix cache and, short of KV, preempts the running request that comes last in that order.
So the plan needs no loop of its own there: each request's priority says where its sample stands in the plan.

- ``arrival``: every request the same priority, vLLM's first-come first-served (verl's own vLLM rollout).
- ``group``: a group's samples together, groups in the order they first arrive: a group's samples run side by side
  on its prompt's cached blocks, and preemption, when KV runs short, takes the newest group's samples.
- ``longest_first``: by each sample's own predicted length, longest first (ties by their group's arrival): the long
  samples start early, so the step does not end waiting for one that started late (LPT for the makespan). A request
  whose prediction is only its group's (a per-prompt history, no probe) runs in ``group`` order: ranking whole
  groups by length starts the groups predicted long together, they fill the KV pool, and vLLM preempts more and
  runs fewer samples a step than first-come first-served.

A *probe* (a sample's first tokens, decoded so that its own prediction exists before its tail is scheduled) comes
before every planned request: the probes of a step run first, in the plan's order, and what they reveal orders the
rest. A probe holds a few tokens of KV, so probes do rank by their group's prediction: the samples of groups
predicted long learn their own prediction first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GROUP_SPAN = 1 << 16  # priorities of one predicted length leave room for this many groups of a step
LENGTH_CAP = 1 << 20  # predicted lengths are capped here: plans span [-LENGTH_CAP * GROUP_SPAN, GROUP_SPAN)
PROBE_OFFSET = (LENGTH_CAP + 1) * GROUP_SPAN  # probes' plans lie below every other plan
REST_WATERMARK = 0.02  # vLLM's KV kept free at admission where samples run longest first by their own predictions


class Ordering:
    """How a step's requests rank: ``rank`` (lower runs first) from the group's arrival ordinal and a prediction."""

    name = ""

    def rank(self, ordinal: int, predicted_len: float, own: bool) -> int:
        """``ordinal``: the request's group's place among the step's groups by first arrival; ``own``: the
        prediction is the sample's own, not only its group's."""
        raise NotImplementedError

    def watermark(self, ranks_samples: bool) -> float:
        """vLLM's ``watermark`` (KV blocks kept free at admission) under this order; ``ranks_samples``: requests
        carry predictions of their own. vLLM's default: nothing kept."""
        return 0.0


class ArrivalOrder(Ordering):
    """Every request the same priority: vLLM's first-come first-served (verl's own vLLM rollout)."""

    name = "arrival"

    def rank(self, ordinal: int, predicted_len: float, own: bool) -> int:
        return 0


class GroupOrder(Ordering):
    """A group's samples together, groups in the order they first arrive."""

    name = "group"

    def rank(self, ordinal: int, predicted_len: float, own: bool) -> int:
        return ordinal


class LongestFirstOrder(Ordering):
    """Each sample by its own predicted length, longest first (ties by their group's arrival); a request with only
    its group's prediction in group order. The long samples' KV grows together, so vLLM keeps ``REST_WATERMARK`` of
    its blocks free when it admits (else it admits into the last ones, then preempts and recomputes)."""

    name = "longest_first"

    def rank(self, ordinal: int, predicted_len: float, own: bool) -> int:
        if not own:  # a group's own prediction does not rank it above another group
            return ordinal
        return ordinal % GROUP_SPAN - min(max(round(predicted_len), 0), LENGTH_CAP) * GROUP_SPAN

    def watermark(self, ranks_samples: bool) -> float:
        return REST_WATERMARK if ranks_samples else 0.0


ORDERINGS: dict[str, type[Ordering]] = {o.name: o for o in (ArrivalOrder, GroupOrder, LongestFirstOrder)}


def make_ordering(name: str) -> Ordering:
    """An ordering by name (``custom.policy`` maps to one: ``settings.vllm_ordering``)."""
    if name not in ORDERINGS:
        raise ValueError(f"unknown ordering {name!r}; choose one of: {', '.join(ORDERINGS)}")
    return ORDERINGS[name]()


@dataclass
class StepPriorities:
    """A step's priorities under ``ordering`` (an ``Ordering``, or its name)."""

    ordering: Ordering | str = "longest_first"
    _ordinal: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.ordering, str):
            self.ordering = make_ordering(self.ordering)

    def new_step(self) -> None:
        """A new rollout step: groups are counted again from the first to arrive."""
        self._ordinal.clear()

    def of(self, group: str, predicted_len: float, own: bool = True) -> int:
        """The priority of a request of ``group`` whose length is predicted ``predicted_len`` (lower runs first;
        vLLM runs equal ones by arrival); ``own``: the prediction is the sample's own, not only its group's."""
        return self._plan(group, predicted_len, own)

    def probe(self, group: str, predicted_len: float) -> int:
        """The priority of a probe of ``group``: before every request :meth:`of` ranks, in the same order among
        probes."""
        return self._plan(group, predicted_len) - PROBE_OFFSET

    def _plan(self, group: str, predicted_len: float, own: bool = True) -> int:
        ordinal = self._ordinal.setdefault(group, len(self._ordinal))
        return self.ordering.rank(ordinal, predicted_len, own)
