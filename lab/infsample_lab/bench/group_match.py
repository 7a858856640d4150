"""What a device-resident group drafter would draft, for the replay's ``group_gpu`` lane and ``eval-drafter``: a
reference in NumPy of the matching a kernel on vLLM's ``ngram_gpu`` contract would run. It does not ship.

Each row's last n tokens (n from ``MAX_N`` down to ``MIN_N``, as vLLM's ``ngram`` config) are looked up in its
group's finished answers (newest first), then in its group's other rows of the batch, then in its own text; the
occurrences at the longest n that has any vote for the draft, token by token: the tokens that most often followed.
No tree and no state beyond what the device would keep: each row's text (vLLM's token buffer) and each group's last
``ANSWERS_KEPT`` answers. Rows are grouped by the server's word (``hints.GROUP_ARG``) or, where none is given, by
their prompt, as ``GroupDrafter`` groups them. How many of a row's matched tokens go in is the product's
``DraftBudget`` (with no proposer time a row: the kernel drafts for every row at once).
"""

from __future__ import annotations

from collections import deque
from typing import Mapping

import numpy as np

from verl_infsample.drafter.budget import DraftPlanner, StepCost
from verl_infsample.drafter.drafting import prompt_tokens_key
from verl_infsample.drafter.hints import GROUP_ARG

MIN_N, MAX_N = 2, 5  # vLLM's ngram config as ``custom.speculative=ngram`` sets it (prompt_lookup_min / _max)
ANSWERS_KEPT = 64  # finished answers a group keeps on the device
RUN_ANSWERS_KEPT = 256  # finished answers of any group the run keeps on the device (the last source)


SEPARATOR = -1  # between the texts of a group's pool


def first_match(source: np.ndarray, pattern: np.ndarray, k: int) -> list[int]:
    """The ``k`` tokens (up to a separator) that follow ``pattern`` in ``source`` most often: at each draft position
    the occurrences still agreeing vote for the next token (a kernel's histogram over the hits), ties to the first
    occurrence; empty where ``pattern`` occurs nowhere with a token after it."""
    n = len(pattern)
    if len(source) <= n:
        return []
    windows = np.lib.stride_tricks.sliding_window_view(source[:-1], n)  # an occurrence must have a token after it
    at = np.flatnonzero((windows == pattern).all(axis=1) & (source[n:] != SEPARATOR)) + n
    draft: list[int] = []
    while len(at) and len(draft) < k:
        nxt = source[at]
        values, first, counts = np.unique(nxt, return_index=True, return_counts=True)
        ok = values != SEPARATOR
        if not ok.any():
            break
        values, first, counts = values[ok], first[ok], counts[ok]
        best = values[np.lexsort((first, -counts))[0]]
        draft.append(int(best))
        at = at[nxt == best] + 1
        at = at[at < len(source)]
    return draft


def _pool(texts: list[np.ndarray]) -> np.ndarray:
    """``texts`` end to end, a separator after each (one search covers them all, in their order)."""
    if not texts:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.append(t.astype(np.int64), SEPARATOR) for t in texts])


class GroupMatchDrafter:
    """``k``: most tokens a row drafts; ``cost``: what a step costs, for the budget (None: drafts cost nothing)."""

    def __init__(self, k: int, cost: StepCost | None = None):
        self.k = k
        self.planner = DraftPlanner(k, cost)
        self.rows: dict[str, tuple[str, int]] = {}  # request id -> (group, response start)
        self.answers: dict[str, deque] = {}  # group -> its last finished answers
        self.run_answers: deque = deque(maxlen=RUN_ANSWERS_KEPT)  # the run's last finished answers, any group
        self._run_pool: np.ndarray | None = None
        self.texts: dict[str, np.ndarray] = {}  # request id -> its tokens at the last step
        self.proposing_rows = 0
        self.scanned_tokens = 0  # tokens the matching read, summed over the n it tried (a kernel's reads)

    def propose(self, batch, sampled: list[list[int]], requests: Mapping | None = None) -> list[list[int]]:
        requests = requests or {}
        present = set(batch.req_ids[:len(sampled)])
        for rid in [r for r in self.rows if r not in present and r not in requests]:  # finished: an answer now
            group, start = self.rows.pop(rid)
            answer = self.texts.pop(rid)[start:]
            self.answers.setdefault(group, deque(maxlen=ANSWERS_KEPT)).appendleft(answer)
            self.run_answers.appendleft(answer)
            self._run_pool = None
            self.planner.forget(rid)
        decoding = [i for i, out in enumerate(sampled) if out]
        by_group: dict[str, list[int]] = {}
        for i in decoding:
            rid, n = batch.req_ids[i], int(batch.num_tokens_no_spec[i])
            if rid not in self.rows:
                prompt = int(batch.num_prompt_tokens[i])
                self.rows[rid] = (_group_of(requests.get(rid)) or prompt_tokens_key(batch.token_ids_cpu[i, :prompt]),
                                  prompt)
            self.texts[rid] = batch.token_ids_cpu[i, :n]
            by_group.setdefault(self.rows[rid][0], []).append(i)
        caps = [self.k] * len(decoding)
        lengths = self.planner.plan([batch.req_ids[i] for i in decoding], caps)
        drafts: list[list[int]] = [[] for _ in sampled]
        pools: dict[str, np.ndarray] = {}  # a group's answers (newest first), then its rows' responses
        for i, k in zip(decoding, lengths):
            if k > 0:
                rid = batch.req_ids[i]
                group = self.rows[rid][0]
                if group not in pools:
                    running = [self.texts[r][self.rows[r][1]:] for r in (batch.req_ids[j] for j in by_group[group])]
                    pools[group] = _pool([*self.answers.get(group, ()), *running])
                if self._run_pool is None:
                    self._run_pool = _pool(list(self.run_answers))
                drafts[i], scanned = self._match(self.texts[rid], (pools[group], self._run_pool), k)
                self.scanned_tokens += scanned
                self.proposing_rows += bool(drafts[i])
        return drafts

    @staticmethod
    def _match(text: np.ndarray, pools: tuple[np.ndarray, np.ndarray], k: int) -> tuple[list[int], int]:
        """The group's pool first (a row's own response is in it: its tail, followed by a separator, never
        matches itself), then the row's whole text (its prompt too), then the run's answers, at each n from the
        longest; and the tokens a kernel reads for it (every source at every n: it matches them all at once)."""
        group, run = pools
        own = _pool([text])
        scanned = (len(group) + len(own) + len(run)) * (MAX_N - MIN_N + 1)
        for n in range(MAX_N, MIN_N - 1, -1):
            if len(text) < n:
                continue
            pattern = text[-n:].astype(np.int64)
            draft = first_match(group, pattern, k) or first_match(own, pattern, k) or first_match(run, pattern, k)
            if draft:
                return draft, scanned
        return [], scanned

    def verified(self, req_ids, drafts, outputs) -> None:
        self.planner.verified(req_ids, drafts, outputs)


def _group_of(request) -> str | None:
    params = getattr(request, "sampling_params", None)
    extra = getattr(params, "extra_args", None) or {}
    return extra.get(GROUP_ARG)
