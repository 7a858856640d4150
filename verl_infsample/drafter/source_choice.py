"""Which of its two drafts a row takes: its group tree's or vLLM's ``suffix`` structure's (``trees.DraftTrees``).

Where one draft goes on from the other, the longer: both sources agree so far. Where they part, the source that
has won the row's recent partings by a clear margin, else the better-scored (each tree's expected number of
accepted tokens). A parting is won in hindsight: a step's verdict reveals the row's next tokens up to the first
rejection, against which both drafts are matched, the one taken and the one not.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import takewhile
from typing import Hashable, Sequence

from .budget import accepted_prefix

WIN_MEMORY = 0.9  # weight of a row's past wins per parting
WIN_MARGIN = 2.0  # (decayed) wins one source needs over the other before it overrules the scores


@dataclass(frozen=True)
class Draft:
    token_ids: list[int]
    score: float  # the tree's expected number of accepted tokens
    source: str  # "group" | "run" (vLLM's structure: the request's prompt or the global tree) | "none"


NO_DRAFT = Draft([], 0.0, "none")


@dataclass
class _Partings:
    group: float = 0.0  # decayed count of partings the group tree's draft won
    run: float = 0.0


class SourceChoice:
    """Each running row's choice between its two drafts, and the partings each source has won for it."""

    def __init__(self):
        self._rows: dict[Hashable, _Partings] = {}
        self._offered: dict[Hashable, tuple[Draft, Draft]] = {}  # this step's two drafts of each row

    def choose(self, req_id: Hashable, group: Draft, run: Draft) -> Draft:
        self._offered[req_id] = (group, run)
        short, long = sorted((group, run), key=lambda d: len(d.token_ids))
        if long.token_ids[:len(short.token_ids)] == short.token_ids:
            return long if len(long.token_ids) > len(short.token_ids) else run
        won = self._rows.get(req_id, _Partings())
        if won.group > won.run + WIN_MARGIN:
            return group
        if won.run > won.group + WIN_MARGIN:
            return run
        return group if group.score > run.score else run

    def verified(self, req_id: Hashable, output: Sequence[int]) -> None:
        """The step's output tokens of a row that drafted (vLLM's: accepted draft tokens and the one sampled after,
        then placeholders below 0)."""
        offered = self._offered.pop(req_id, None)
        if offered is None or offered[0].token_ids == offered[1].token_ids:
            return
        known = list(takewhile(lambda t: t >= 0, (int(t) for t in output)))
        group, run = (accepted_prefix(d.token_ids, known) for d in offered)
        won = self._rows.setdefault(req_id, _Partings())
        won.group = WIN_MEMORY * won.group + (group > run)
        won.run = WIN_MEMORY * won.run + (run > group)

    def forget(self, req_id: Hashable) -> None:
        self._rows.pop(req_id, None)
        self._offered.pop(req_id, None)
