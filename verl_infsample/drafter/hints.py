"""What a server tells the drafter of each request, beside what vLLM's batch shows: the sample's group, its
predicted length, where its response starts, and whether the request is only a sample's head.

A sample reaches vLLM as one request, or as a probe (its first k tokens, a *head*) and a rest whose prompt carries
the probe's tokens; verl resumes a request it aborted (a weight sync in its asynchronous modes) under the same id,
its prompt holding the partial answer. In all three the drafter must see one sample: one group, one answer in its
group's tree (a head's tokens are not an answer of their own), its response counted from its first arrival's prompt,
its predicted end at the latest prediction. :class:`SampleArrival` writes those facts as vLLM's ``extra_args``, for
the server and for the replay alike; :class:`RowHints` reads them back in the drafter.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

GROUP_ARG = "infsample_group"  # the sample's group: its prompt's key, the same for its probe and its rest
PREDICTED_ARG = "infsample_predicted"  # its predicted response length, counted from RESPONSE_START_ARG
RESPONSE_START_ARG = "infsample_response_start"  # prompt tokens before its response (absent: the whole prompt)
HEAD_ARG = "infsample_head"  # a probe: a rest continues its tokens, which are no answer of their own
HINT_KEYS = (GROUP_ARG, PREDICTED_ARG, RESPONSE_START_ARG, HEAD_ARG)
Part = Literal["whole", "head", "rest"]


def length_hint(predicted_len: float | None, budget: int) -> int:
    """The length the drafter is told: the plan's prediction, else the sample's token budget."""
    return int(predicted_len) if predicted_len else int(budget)


@dataclass(frozen=True)
class SampleArrival:
    """One arrival of a sample at the server: ``prompt_len`` tokens of prompt, of which those past
    ``response_start`` are its answer so far (a resumed request)."""

    group: str
    response_start: int
    prompt_len: int

    def extra_args(self, predicted: int, part: Part = "whole") -> dict:
        """The hints of one vLLM request of this arrival. ``predicted``: the plan's length for what this arrival
        generates (a rest's: the whole arrival's, after its probe)."""
        done = self.prompt_len - self.response_start
        args = {GROUP_ARG: self.group, PREDICTED_ARG: done + int(predicted)}
        if done or part == "rest":
            args[RESPONSE_START_ARG] = self.response_start
        if part == "head":
            args[HEAD_ARG] = True
        return args


class DraftHints:
    """The server's arrivals: a request verl resumes after an abort keeps its first arrival's group and response
    start (not a new group keyed by the longer prompt, nor the partial answer counted as prompt)."""

    KEPT = 65_536  # aborted requests remembered until they resume (the oldest forgotten first)

    def __init__(self):
        self._aborted: OrderedDict[str, SampleArrival] = OrderedDict()

    def arrive(self, request_id: str, prompt_len: int, group: str) -> SampleArrival:
        first = self._aborted.pop(request_id, None)
        if first is None:
            return SampleArrival(group, prompt_len, prompt_len)
        return SampleArrival(first.group, first.response_start, prompt_len)

    def ended(self, request_id: str, arrival: SampleArrival, stop_reason: str | None) -> None:
        """The request's output came back (``stop_reason`` None: it failed); an aborted one will be resumed."""
        if stop_reason in ("aborted", "abort"):
            self._aborted[request_id] = arrival
            while len(self._aborted) > self.KEPT:
                self._aborted.popitem(last=False)


@dataclass(frozen=True)
class RowHints:
    """The hints as the drafter reads them (None where a plain vLLM request carries none)."""

    group: str | None = None
    predicted: int | None = None
    response_start: int | None = None
    head: bool = False

    @classmethod
    def read(cls, extra_args: dict | None) -> "RowHints":
        a = extra_args or {}
        predicted, start = a.get(PREDICTED_ARG), a.get(RESPONSE_START_ARG)
        return cls(a.get(GROUP_ARG), int(predicted) if predicted is not None else None,
                   int(start) if start is not None else None, bool(a.get(HEAD_ARG, False)))


NO_HINTS = RowHints()
