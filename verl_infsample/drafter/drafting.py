"""The group drafter's drafting, free of vLLM's types: one step's drafts for a batch of rows, and what the verdicts
teach.

Each step, rows start (their prompt into the trees, keyed by their group), grow (their new tokens into the trees
in runs of ``SYNC_EVERY``, into their group's tree at once for a row about to draft) and stop (a finished answer
stays a draft source; a head's is dropped, its rest carries it). ``budget.DraftBudget`` says how many tokens each
row drafts, ``trees.DraftTrees`` what they are, weighing what a step costs (``budget.StepCost``: the proposer's own time measured
here, the step's seconds told by :meth:`Drafting.step_took`). The verdicts feed each row's acceptance, the choice of
source and the law tally.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field
from typing import Mapping, Protocol, Sequence

import numpy as np

from .budget import DraftPlanner
from .hints import NO_HINTS, RowHints
from .law_guard import LawTally
from .trees import MAX_TREE_DEPTH, DraftTrees

SYNC_EVERY = 8  # tokens a row that does not draft may run ahead of the trees before they take its new tokens


class Batch(Protocol):
    """A step's rows, as vLLM's ``InputBatch`` holds them (the lab's ``OfflineBatch`` too)."""

    req_ids: Sequence[str]
    num_prompt_tokens: np.ndarray
    num_tokens_no_spec: np.ndarray
    token_ids_cpu: np.ndarray


@dataclass
class DrafterStats:
    """What the drafter did since the last :meth:`Drafting.pop_stats` (summed over steps)."""
    steps: int = 0
    rows: int = 0  # decoding rows seen
    proposing_rows: int = 0  # rows the budget let propose
    drafted: int = 0  # draft tokens verified
    accepted: int = 0
    from_group: int = 0  # drafts taken from the group's tree (the rest from the prompt or the run's tree)
    propose_s: float = 0.0
    drafting_s: float = 0.0  # of which spent on the rows that drafted (their trees brought up to date, the draft)
    law: LawTally = field(default_factory=LawTally)
    group_bytes: int = 0  # the group trees' (at the last pop)
    tree_bytes: int = 0  # every tree's, the run's and the groups' (bounded: ``trees.TREE_BYTES``)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Row:
    response_start: int  # the row's tokens before its response (its sample's first prompt)
    predicted: int | None  # its predicted response length
    synced: int  # its tokens its group's tree holds (prompt and response so far)
    run_synced: int  # its tokens up to which the run's tree holds its response (the prompt is not in it)
    unsynced: np.ndarray | None = None  # its tokens past the lower of the two, kept for the trees when it ends


class Drafting:
    """``k``: most tokens a row drafts; ``max_model_len``: a row drafts no further than its room in the model. What
    a step costs is ``planner.cost`` (``budget.StepCost``: its adapter prices a verified token)."""

    def __init__(self, k: int, max_model_len: int):
        self.k, self.max_model_len = k, max_model_len
        self.planner = DraftPlanner(k)
        self.trees = DraftTrees()
        self.rows: dict[str, _Row] = {}
        self.stats = DrafterStats()

    def propose_batch(self, batch: Batch, sampled_token_ids: Sequence[Sequence[int]],
                      hints: Mapping[str, RowHints] | None = None) -> list[list[int]]:
        """One draft per row of ``batch``. ``hints``: what the server told of each request the engine holds (a row
        out of the batch but still there is preempted: it comes back, and goes on where it was)."""
        start = time.perf_counter()
        hints = hints if hints is not None else {}
        req_ids, token_ids = batch.req_ids, batch.token_ids_cpu
        counts = batch.num_tokens_no_spec[:len(sampled_token_ids)].tolist()
        decoding, caps = [], []
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:  # a partial prefill
                continue
            req_id, n = req_ids[i], counts[i]
            row = self.rows.get(req_id)
            if row is None:
                row = self._start(req_id, token_ids[i], int(batch.num_prompt_tokens[i]), hints.get(req_id, NO_HINTS))
            cap = self.max_model_len - n - 1
            left = row.predicted - (n - row.response_start) if row.predicted is not None else 0
            if left > 0:  # no further than its predicted end; one that outlived it is bounded by its room alone
                cap = min(cap, left)
            decoding.append((i, req_id, n, row))
            caps.append(cap)
        lengths = self.planner.plan([d[1] for d in decoding], caps)
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        self.stats.rows += len(decoding)
        drafting_before = self.stats.drafting_s
        for (i, req_id, n, row), k in zip(decoding, lengths):
            if k <= 0:
                self._sync(req_id, row, token_ids[i], n, False)
                continue
            began = time.perf_counter()
            self.stats.proposing_rows += 1
            tokens = token_ids[i]
            self._sync(req_id, row, tokens, n, True)
            draft = self.trees.propose(req_id, tokens[max(0, n - MAX_TREE_DEPTH):n], k)
            self.stats.from_group += draft.source == "group"
            drafts[i] = draft.token_ids
            self.stats.drafting_s += time.perf_counter() - began
        self.planner.cost.proposed(self.stats.drafting_s - drafting_before, self.planner.budget.planned[1])
        seen = set(req_ids[:len(sampled_token_ids)])
        for req_id in [r for r in self.rows if r not in seen and r not in hints]:
            self._stop(req_id)
        self.stats.steps += 1
        self.stats.propose_s += time.perf_counter() - start
        return drafts

    def step_took(self, seconds: float) -> None:
        """The step that verified the last proposal's drafts took ``seconds``, its proposing included."""
        self.planner.step_took(seconds)

    def verified(self, req_ids, draft_token_ids: list[list[int]], output_token_ids, probabilities=None) -> None:
        """The verdicts on a step's drafts: row i kept the leading draft tokens equal to its output.
        ``probabilities[i]`` (target probabilities of row i's draft tokens, or None) feed the law tally."""
        s = self.stats
        accepted = self.planner.verified(req_ids, draft_token_ids, output_token_ids)
        for i, (draft, a) in enumerate(zip(draft_token_ids, accepted)):
            if not draft:
                continue
            s.drafted += len(draft)
            s.accepted += a
            self.trees.verified(req_ids[i], output_token_ids[i])
            p = probabilities[i] if probabilities is not None else None
            if p is not None:
                for j in range(min(a + 1, len(draft))):  # tested: up to and including the first rejection
                    s.law.add(j < a, float(p[j]))

    def pop_stats(self) -> DrafterStats:
        self.stats.group_bytes, self.stats.tree_bytes = self.trees.group_memory(), self.trees.memory()
        stats, self.stats = self.stats, DrafterStats()
        return stats

    def _start(self, req_id: str, tokens: np.ndarray, prompt_len: int, hints: RowHints) -> _Row:
        """A new row: the trees take its prompt, and as its response what its prompt holds past its response's start
        (a probe's tokens, the partial answer of a resumed request)."""
        start = hints.response_start if hints.response_start is not None else prompt_len
        start = min(max(0, start), prompt_len)
        self.trees.start(req_id, hints.group or prompt_tokens_key(tokens[:start]), tokens[:start], answer=not hints.head)
        self.trees.extend(req_id, tokens[start:prompt_len])
        self.planner.forget(req_id)  # a request id used again starts afresh
        row = self.rows[req_id] = _Row(start, hints.predicted, prompt_len, prompt_len)
        return row

    def _sync(self, req_id: str, row: _Row, tokens: np.ndarray, n: int, drafting: bool) -> None:
        """The trees take a row's tokens in runs of ``SYNC_EVERY``: the run's tree (other groups' drafts) and the
        group's (its siblings') at most that many tokens late; a row about to draft has its group's tree up to
        date. The tokens neither has yet are kept, for the trees when the row ends."""
        if n > row.synced and (drafting or n - row.synced >= SYNC_EVERY):
            self.trees.extend_group(req_id, tokens[row.synced:n])
            row.synced = n
        if n - row.run_synced >= SYNC_EVERY:
            self.trees.extend_run(req_id, tokens[row.run_synced:n])
            row.run_synced = n
        low = min(row.synced, row.run_synced)
        row.unsynced = tokens[low:n].copy() if n > low else None

    def _stop(self, req_id: str) -> None:
        """The row left the engine: its last tokens, which the trees have not had yet, go in, then it stops."""
        row = self.rows.pop(req_id)
        if row.unsynced is not None:  # it starts where the less advanced of the two trees stopped
            low = min(row.synced, row.run_synced)
            self.trees.extend_group(req_id, row.unsynced[row.synced - low:])
            self.trees.extend_run(req_id, row.unsynced[row.run_synced - low:])
        self.trees.stop(req_id)
        self.planner.forget(req_id)


def prompt_tokens_key(prompt: np.ndarray) -> str:
    """A group's key where the server names none (plain vLLM): the rows that share its prompt."""
    return hashlib.blake2b(np.ascontiguousarray(prompt, dtype=np.int64).tobytes(), digest_size=12).hexdigest()
