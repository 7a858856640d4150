"""Where a draft comes from: a suffix tree per group (its siblings' responses, running and finished, and the same
prompt's answers of earlier steps) beside vLLM's own ``suffix`` structure (the request's prompt and one global tree
of the run's recent responses). Which of the two drafts a row takes, ``source_choice.SourceChoice`` says.

Trees are arctic-inference's C++ suffix trees (``SuffixDecodingCache`` for vLLM's part, its ``SuffixTree`` for the
groups). Memory is bounded in bytes, counted at ``TREE_BYTES_PER_TOKEN``: all trees together stay under
``memory_bytes``. The run's tree keeps at most half of it (and at most ``GLOBAL_RESPONSES`` answers, as vLLM's own
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


@dataclass(frozen=True)
class _Member:
    group: Hashable
    seq: int  # its sequence id in the group's tree
    answer: bool  # kept as an answer when it stops (a head's tokens are not)


class DraftTrees:
    """Requests start, grow and stop; each may ask for a draft of its next tokens at any time."""

    def __init__(self, *, memory_bytes: int = TREE_BYTES, group_responses: int = GROUP_RESPONSES):
        SuffixDecodingCache, self._SuffixTree = _arctic()
        self.memory_bytes, self.group_responses = memory_bytes, group_responses
        # one more than ours: the run's tree never drops an answer by itself, so what it holds is what is counted here
        self.run = SuffixDecodingCache(max_tree_depth=MAX_TREE_DEPTH, max_cached_requests=GLOBAL_RESPONSES + 1)
        self._run_active: dict[Hashable, int] = {}  # running request -> its tokens in the run's trees
        self._run_cached: OrderedDict[Hashable, int] = OrderedDict()  # finished answer -> its tokens, oldest first
        self._run_tokens = 0
        self.groups: OrderedDict[Hashable, _Group] = OrderedDict()  # least recently used first
        self.choice = SourceChoice()
        self._member: dict[Hashable, _Member] = {}  # running request -> where it is in its group
        self._tokens = 0  # in all group trees

    @property
    def active(self):
        return self._member.keys()

    def start(self, req_id: Hashable, group: Hashable, prompt: Sequence[int] | np.ndarray, answer: bool = True) -> None:
        """``answer`` False: the request is a sample's head (its probe), whose tokens leave the trees when it stops:
        its rest carries them, as one answer."""
        if req_id in self.run.active_requests:
            self.stop(req_id)
        if req_id in self.run.cached_requests:  # a request id used again (vLLM's own proposer does the same)
            self._drop_run_answer(req_id)
        self.run.start_request(req_id, _int32(prompt))
        self._run_active[req_id] = len(prompt)
        self._run_tokens += len(prompt)
        g = self.groups.get(group)
        if g is None:
            g = self.groups[group] = _Group(self._SuffixTree(MAX_TREE_DEPTH))
        self.groups.move_to_end(group)
        g.running.add(g.next_seq)
        self._member[req_id] = _Member(group, g.next_seq, answer)
        g.next_seq += 1

    def extend(self, req_id: Hashable, tokens: Sequence[int] | np.ndarray) -> None:
        if len(tokens) == 0:
            return
        tokens = _int32(tokens)
        self.run.add_active_response(req_id, tokens)
        self._run_active[req_id] += len(tokens)
        self._run_tokens += len(tokens)
        m = self._member[req_id]
        g = self.groups[m.group]
        g.tree.extend_ndarray(m.seq, tokens)
        g.tokens[m.seq] = g.tokens.get(m.seq, 0) + len(tokens)
        g.total += len(tokens)
        self._tokens += len(tokens)

    def stop(self, req_id: Hashable) -> None:
        """The request left the batch (finished or aborted): its response stays a draft source, a head's aside."""
        self.run.stop_request(req_id)
        self.choice.forget(req_id)
        self._run_cached[req_id] = self._run_active.pop(req_id)  # its prompt's tree goes; its answer stays
        m = self._member.pop(req_id)
        if not m.answer:
            self._drop_run_answer(req_id)
        while self._run_cached and (len(self._run_cached) > GLOBAL_RESPONSES
                                    or self.run_memory() > self.memory_bytes // 2):
            self._drop_run_answer(next(iter(self._run_cached)))
        g = self.groups[m.group]
        g.running.discard(m.seq)
        if m.answer:
            g.finished.append(m.seq)
        else:
            self._drop_sequence(g, m.seq)
        while len(g.finished) > self.group_responses:
            self._drop_sequence(g, g.finished.popleft())
        self._evict()

    def propose(self, req_id: Hashable, context: np.ndarray | Sequence[int], max_tokens: int) -> Draft:
        if max_tokens <= 0:
            return NO_DRAFT
        context = _int32(context[-MAX_TREE_DEPTH:])
        run = self.run.speculate(req_id, context, max_spec_tokens=max_tokens, min_token_prob=MIN_TOKEN_PROB)
        group = self._member[req_id].group
        self.groups.move_to_end(group)
        d = self.groups[group].tree.speculate_ndarray(context, max_tokens, GROUP_SPEC_FACTOR, 0.0, MIN_TOKEN_PROB,
                                                      False)
        best = self.choice.choose(req_id, Draft(list(d.token_ids), d.score, "group"),
                                  Draft(list(run.token_ids), run.score, "run"))
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

    def _drop_sequence(self, g: _Group, seq: int) -> None:
        g.tree.remove(seq)
        dropped = g.tokens.pop(seq, 0)
        g.total -= dropped
        self._tokens -= dropped

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
