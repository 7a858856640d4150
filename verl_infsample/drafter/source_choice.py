"""Which of its two drafts a row takes: its group tree's or the run's tree's (``trees.DraftTrees``).

Where one draft goes on from the other, the longer: both sources agree so far (a group draft as long as the row may
draft is taken without asking the run's tree: :meth:`SourceChoice.unopposed`). Where they part, the source that
has won the row's recent partings by a clear margin, else the better-scored (each tree's expected number of
accepted tokens). A parting is won in hindsight: a step's verdict reveals the row's next tokens up to the first
rejection, against which both drafts are matched, the one taken and the one not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, NamedTuple, Sequence

from .budget import accepted_prefix

WIN_MEMORY = 0.9  # weight of a row's past wins per parting
WIN_MARGIN = 2.0  # (decayed) wins one source needs over the other before it overrules the scores


class Draft(NamedTuple):
    token_ids: list[int]
    score: float  # the tree's expected number of accepted tokens
    source: str  # "group" (the group's tree: its prompt, its responses) | "run" (the run's responses) | "none"


NO_DRAFT = Draft([], 0.0, "none")


@dataclass
class _Partings:
    group: float = 0.0  # decayed count of partings the group tree's draft won
    run: float = 0.0


_NO_PARTINGS = _Partings()


class SourceChoice:
    """Each running row's choice between its two drafts, and the partings each source has won for it."""

    def __init__(self):
        self._rows: dict[Hashable, _Partings] = {}
        self._offered: dict[Hashable, tuple[list, list]] = {}  # this step's two drafts of each row, where they differ

    def choose(self, req_id: Hashable, group: list[int], group_score: float, run: list[int], run_score: float
               ) -> Draft:
        """The draft the row takes of its group tree's (``group``, its tree's score) and the run's."""
        if group != run:
            self._offered[req_id] = (group, run)
            if len(group) > len(run):
                if group[:len(run)] == run:
                    return Draft(group, group_score, "group")
            elif run[:len(group)] == group:  # the run's goes further
                return Draft(run, run_score, "run")
            won = self._rows.get(req_id, _NO_PARTINGS)
            if won.group > won.run + WIN_MARGIN or (won.run <= won.group + WIN_MARGIN and group_score > run_score):
                return Draft(group, group_score, "group")
        else:
            self._offered.pop(req_id, None)
        return Draft(run, run_score, "run") if run else NO_DRAFT

    def unopposed(self, req_id: Hashable, draft: Draft) -> Draft:
        """The row takes ``draft``, the other source not asked: no parting to learn from."""
        self._offered.pop(req_id, None)
        return draft

    def verified(self, req_id: Hashable, output: Sequence[int]) -> None:
        """The step's output tokens of a row that drafted (vLLM's: accepted draft tokens and the one sampled after,
        then placeholders below 0)."""
        offered = self._offered.pop(req_id, None)
        if offered is None:  # the two drafts were one
            return
        # a placeholder (below 0) matches no draft token: what follows it is unknown
        group, run = accepted_prefix(offered[0], output), accepted_prefix(offered[1], output)
        won = self._rows.setdefault(req_id, _Partings())
        won.group = WIN_MEMORY * won.group + (group > run)
        won.run = WIN_MEMORY * won.run + (run > group)

    def forget(self, req_id: Hashable) -> None:
        self._rows.pop(req_id, None)
        self._offered.pop(req_id, None)
