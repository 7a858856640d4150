"""Where a draft comes from: a suffix tree per group (its siblings' responses, running and finished, and the same
prompt's answers of earlier steps) beside vLLM's own ``suffix`` structure (the request's prompt and one global tree
of the run's recent responses). Which of the two drafts a row takes, ``source_choice.SourceChoice`` says.

Trees are arctic-inference's C++ suffix trees (``SuffixDecodingCache`` for vLLM's part, its ``SuffixTree`` for the
groups). Memory is bounded in bytes, counted at ``TREE_BYTES_PER_TOKEN``: all trees together stay under
``memory_bytes``. The run's tree keeps at most half of it (and at most ``global_responses`` answers, as vLLM's own
suffix drafter), its oldest answers dropped first; the groups keep what the run's tree leaves, each its latest
``group_responses`` answers, least recently used groups with nothing running dropped first. What is running is
never dropped.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Hashable, Sequence

import numpy as np

from .source_choice import NO_DRAFT, Draft, SourceChoice

MAX_TREE_DEPTH = 24  # vLLM's suffix_decoding_max_tree_depth default: drafts match at most this many recent tokens
MIN_TOKEN_PROB = 0.1  # vLLM's suffix_decoding_min_token_prob default
GLOBAL_RESPONSES = 10_000  # vLLM's suffix_decoding_max_cached_requests default
TREE_BYTES = 2 << 30  # all trees of a drafter together, at TREE_BYTES_PER_TOKEN
# what a depth-24 tree takes per token at most (its own estimate_memory on random text; repetitive text takes a
# tenth): counted here, not asked of the trees, whose estimate walks every node
TREE_BYTES_PER_TOKEN = 256
GROUP_RESPONSES = 64  # a group's answers kept (its latest)
GROUP_SPEC_FACTOR = 2.0  # a group's tree drafts up to 2x its match length (vLLM's suffix: 1x): its siblings' text
# continues the sample's more often than the run's text does (docs/results.md: eval-drafter, tuning prompts named)


def _arctic():
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
        from arctic_inference.suffix_decoding._C import SuffixTree
    except ImportError as e:  # the settings refuse drafts that need it before anything starts; this is the backstop
        raise ImportError("suffix-tree drafts need arctic-inference 0.3.0, a source build: README, Install "
                          "(`infsample doctor` names the commands)") from e
    return SuffixDecodingCache, SuffixTree


@dataclass
class _Group:
    tree: object
    running: set = field(default_factory=set)
    finished: deque = field(default_factory=deque)  # sequence ids, oldest first
    next_seq: int = 0
    tokens: dict = field(default_factory=dict)  # sequence id -> its tokens in the tree
    total: int = 0  # their sum


class DraftTrees:
    """Requests start, grow and stop; each may ask for a draft of its next tokens at any time."""

    def __init__(self, *, max_depth: int = MAX_TREE_DEPTH, min_token_prob: float = MIN_TOKEN_PROB,
                 global_responses: int = GLOBAL_RESPONSES, memory_bytes: int = TREE_BYTES,
                 group_responses: int = GROUP_RESPONSES, use_groups: bool = True,
                 group_spec_factor: float = GROUP_SPEC_FACTOR,
                 group_spec_offset: float = 0.0, group_min_prob: float | None = None):
        SuffixDecodingCache, self._SuffixTree = _arctic()
        self.max_depth, self.min_token_prob = max_depth, min_token_prob
        self.memory_bytes, self.group_responses, self.use_groups = memory_bytes, group_responses, use_groups
        self.global_responses = global_responses
        self.group_spec = (group_spec_factor, group_spec_offset,
                           min_token_prob if group_min_prob is None else group_min_prob)
        # one more than ours: the run's tree never drops an answer by itself, so what it holds is what is counted here
        self.run = SuffixDecodingCache(max_tree_depth=max_depth, max_cached_requests=global_responses + 1)
        self._run_active: dict[Hashable, int] = {}  # running request -> its tokens in the run's trees
        self._run_cached: OrderedDict[Hashable, int] = OrderedDict()  # finished answer -> its tokens, oldest first
        self._run_tokens = 0
        self.groups: OrderedDict[Hashable, _Group] = OrderedDict()  # least recently used first
        self.choice = SourceChoice()
        self._member: dict[Hashable, tuple[Hashable, int]] = {}  # running request -> (group, sequence id)
        self._tokens = 0  # in all group trees

    @property
    def active(self):
        return self._member.keys()

    def start(self, req_id: Hashable, group: Hashable, prompt: Sequence[int] | np.ndarray) -> None:
        if req_id in self.run.active_requests:
            self.stop(req_id)
        if req_id in self.run.cached_requests:  # a request id used again (vLLM's own proposer does the same)
            self._drop_run_answer(req_id)
        self.run.start_request(req_id, _int32(prompt))
        self._run_active[req_id] = len(prompt)
        self._run_tokens += len(prompt)
        if self.use_groups:
            g = self.groups.get(group)
            if g is None:
                g = self.groups[group] = _Group(self._SuffixTree(self.max_depth))
            self.groups.move_to_end(group)
            g.running.add(g.next_seq)
            self._member[req_id] = (group, g.next_seq)
            g.next_seq += 1
        else:
            self._member[req_id] = (None, -1)

    def extend(self, req_id: Hashable, tokens: Sequence[int] | np.ndarray) -> None:
        if len(tokens) == 0:
            return
        tokens = _int32(tokens)
        self.run.add_active_response(req_id, tokens)
        self._run_active[req_id] += len(tokens)
        self._run_tokens += len(tokens)
        group, seq = self._member[req_id]
        if group is not None:
            g = self.groups[group]
            g.tree.extend_ndarray(seq, tokens)
            g.tokens[seq] = g.tokens.get(seq, 0) + len(tokens)
            g.total += len(tokens)
            self._tokens += len(tokens)

    def stop(self, req_id: Hashable) -> None:
        """The request left the batch (finished, aborted or preempted): its response stays a draft source."""
        self.run.stop_request(req_id)
        self.choice.forget(req_id)
        self._run_cached[req_id] = self._run_active.pop(req_id)  # its prompt's tree goes; its answer stays
        while self._run_cached and (len(self._run_cached) > self.global_responses
                                    or self.run_memory() > self.memory_bytes // 2):
            self._drop_run_answer(next(iter(self._run_cached)))
        group, seq = self._member.pop(req_id)
        if group is None:
            return
        g = self.groups[group]
        g.running.discard(seq)
        g.finished.append(seq)
        while len(g.finished) > self.group_responses:
            oldest = g.finished.popleft()
            g.tree.remove(oldest)
            dropped = g.tokens.pop(oldest, 0)
            g.total -= dropped
            self._tokens -= dropped
        self._evict()

    def propose(self, req_id: Hashable, context: np.ndarray | Sequence[int], max_tokens: int) -> Draft:
        if max_tokens <= 0:
            return NO_DRAFT
        context = _int32(context[-self.max_depth:])
        run = self.run.speculate(req_id, context, max_spec_tokens=max_tokens, min_token_prob=self.min_token_prob)
        best = Draft(list(run.token_ids), run.score, "run")
        group, _ = self._member[req_id]
        if group is not None:
            self.groups.move_to_end(group)
            d = self.groups[group].tree.speculate_ndarray(context, max_tokens, *self.group_spec, False)
            best = self.choice.choose(req_id, Draft(list(d.token_ids), d.score, "group"), best)
        return best if best.token_ids else NO_DRAFT

    def verified(self, req_id: Hashable, output: Sequence[int]) -> None:
        """The step's output tokens of a row that drafted: what its next tokens were, for the choice of source."""
        self.choice.verified(req_id, output)

    def group_memory(self) -> int:
        """The group trees' bytes, at ``TREE_BYTES_PER_TOKEN``."""
        return TREE_BYTES_PER_TOKEN * self._tokens

    def run_memory(self) -> int:
        """The run's trees' bytes (its answers, and the prompts running), at ``TREE_BYTES_PER_TOKEN``."""
        return TREE_BYTES_PER_TOKEN * self._run_tokens

    def memory(self) -> int:
        return self.run_memory() + self.group_memory()

    def _drop_run_answer(self, req_id: Hashable) -> None:
        self.run.evict_cached_response(req_id)
        self._run_tokens -= self._run_cached.pop(req_id, 0)

    def _evict(self) -> None:
        if self.memory() <= self.memory_bytes:
            return
        for key in list(self.groups):  # least recently used first
            g = self.groups[key]
            if g.running:
                continue
            self._tokens -= g.total
            del self.groups[key]
            if self.memory() <= self.memory_bytes:
                return


def _int32(tokens) -> np.ndarray:
    return np.ascontiguousarray(tokens, dtype=np.int32)
