"""Where a draft comes from: a suffix tree per group (its prompts and its responses, running and finished, the same
prompt's answers of earlier steps among them) beside one tree of the run's recent responses, as vLLM's own
``suffix`` keeps one. Which of the two drafts a row takes, ``source_choice.SourceChoice`` says.

The trees are arctic-inference's C++ ``SuffixTree``, called directly. vLLM's ``suffix`` matches a row in a tree of
its own (its prompt and response) and in the run's: here the row's prompt and response are in its group's tree, so
a row's tokens go into two trees and a draft asks two, as with vLLM's. A prompt is kept once per group while a
request with it runs.

Memory is bounded in bytes, counted at ``TREE_BYTES_PER_TOKEN``: all trees together stay under ``memory_bytes``.
The run's tree keeps at most half of it (and at most ``GLOBAL_RESPONSES`` answers, as vLLM's own suffix drafter),
its oldest answers dropped first; the groups keep what the run's tree leaves, each its latest ``group_responses``
answers, least recently used groups with nothing running dropped first. What is running is never dropped.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Hashable, Sequence

import numpy as np

from .source_choice import NO_DRAFT, Draft, SourceChoice

MAX_TREE_DEPTH = 24  # vLLM's suffix_decoding_max_tree_depth default: drafts match at most this many recent tokens
MIN_TOKEN_PROB = 0.1  # vLLM's suffix_decoding_min_token_prob default
RUN_SPEC_FACTOR = 1.0  # vLLM's suffix_decoding_max_spec_factor default: the run's tree drafts up to 1x its match
GLOBAL_RESPONSES = 10_000  # vLLM's suffix_decoding_max_cached_requests default
TREE_BYTES = 2 << 30  # all trees of a drafter together, at TREE_BYTES_PER_TOKEN
# what a depth-24 tree takes per token at most (its own estimate_memory on random text; repetitive text takes a
# tenth): counted here, not asked of the trees, whose estimate walks every node
TREE_BYTES_PER_TOKEN = 256
GROUP_RESPONSES = 64  # a group's answers kept (its latest)
GROUP_SPEC_FACTOR = 2.0  # a group's tree drafts up to 2x its match length (vLLM's suffix: 1x): its siblings' text
# continues the sample's more often than the run's text does (docs/results.md: eval-drafter, tuning prompts named)
SEQ_IDS = 1 << 31  # a tree's sequence ids are int32


def _suffix_tree():
    try:
        from arctic_inference.suffix_decoding._C import SuffixTree
    except ImportError as e:  # the settings refuse drafts that need it before anything starts; this is the backstop
        raise ImportError("suffix-tree drafts need arctic-inference 0.3.0, a source build: README, Install "
                          "(`infsample doctor` names the commands)") from e
    return SuffixTree


@dataclass
class _Prompt:
    seq: int  # its sequence id in the group's tree
    tokens: int
    running: int = 0  # requests with it running


@dataclass
class _Group:
    tree: object
    running: set = field(default_factory=set)
    finished: deque = field(default_factory=deque)  # sequence ids, oldest first
    next_seq: int = 0
    tokens: dict = field(default_factory=dict)  # response sequence id -> its tokens in the tree
    total: int = 0  # their sum (responses; prompts apart)
    prompts: dict = field(default_factory=dict)  # prompt tokens (bytes) -> _Prompt
    prompt_tokens: int = 0

    def new_seq(self) -> int:
        seq, self.next_seq = self.next_seq, (self.next_seq + 1) % SEQ_IDS
        return seq


@dataclass(frozen=True)
class _Member:
    group: Hashable
    seq: int  # its response's sequence id in the group's tree
    prompt: bytes  # its prompt's key in the group
    run_seq: int  # its response's sequence id in the run's tree
    answer: bool  # kept as an answer when it stops (a head's tokens are not)


class DraftTrees:
    """Requests start, grow and stop; each may ask for a draft of its next tokens at any time."""

    def __init__(self, *, memory_bytes: int = TREE_BYTES, group_responses: int = GROUP_RESPONSES):
        self._SuffixTree = _suffix_tree()
        self.memory_bytes, self.group_responses = memory_bytes, group_responses
        self.run = self._SuffixTree(MAX_TREE_DEPTH)  # every request's response, running or finished
        self._run_next_seq = 0
        self._run_tokens: dict[int, int] = {}  # run sequence id -> its tokens
        self._run_total = 0
        self._run_cached: OrderedDict[Hashable, int] = OrderedDict()  # finished answer -> its run seq, oldest first
        self.groups: OrderedDict[Hashable, _Group] = OrderedDict()  # least recently used first
        self.choice = SourceChoice()
        self._member: dict[Hashable, _Member] = {}  # running request -> where it is
        self._tokens = 0  # in all group trees, prompts included

    @property
    def active(self):
        return self._member.keys()

    def start(self, req_id: Hashable, group: Hashable, prompt: Sequence[int] | np.ndarray, answer: bool = True) -> None:
        """``answer`` False: the request is a sample's head (its probe), whose tokens leave the trees when it stops:
        its rest carries them, as one answer."""
        if req_id in self._member:
            self.stop(req_id)
        if req_id in self._run_cached:  # a request id used again (vLLM's own proposer does the same)
            self._drop_run_answer(req_id)
        g = self.groups.get(group)
        if g is None:
            g = self.groups[group] = _Group(self._SuffixTree(MAX_TREE_DEPTH))
        self.groups.move_to_end(group)
        prompt = _int32(prompt)
        key = prompt.tobytes()
        p = g.prompts.get(key)
        if p is None:
            p = g.prompts[key] = _Prompt(g.new_seq(), len(prompt))
            g.tree.extend_ndarray(p.seq, prompt)
            g.prompt_tokens += len(prompt)
            self._tokens += len(prompt)
        p.running += 1
        seq = g.new_seq()
        g.running.add(seq)
        run_seq = self._run_next_seq
        while run_seq in self._run_tokens:  # after 2^31 requests: one still held keeps its id
            run_seq = (run_seq + 1) % SEQ_IDS
        self._run_next_seq = (run_seq + 1) % SEQ_IDS
        self._run_tokens[run_seq] = 0
        self._member[req_id] = _Member(group, seq, key, run_seq, answer)

    def extend(self, req_id: Hashable, tokens: Sequence[int] | np.ndarray) -> None:
        """``tokens`` go on the request's response, in its group's tree and in the run's."""
        self.extend_group(req_id, tokens)
        self.extend_run(req_id, tokens)

    def extend_group(self, req_id: Hashable, tokens: Sequence[int] | np.ndarray) -> None:
        n = len(tokens)
        if n == 0:
            return
        m = self._member[req_id]
        g = self.groups[m.group]
        g.tree.extend_ndarray(m.seq, _int32(tokens))
        g.tokens[m.seq] = g.tokens.get(m.seq, 0) + n
        g.total += n
        self._tokens += n

    def extend_run(self, req_id: Hashable, tokens: Sequence[int] | np.ndarray) -> None:
        n = len(tokens)
        if n == 0:
            return
        seq = self._member[req_id].run_seq
        self.run.extend_ndarray(seq, _int32(tokens))
        self._run_tokens[seq] += n
        self._run_total += n

    def stop(self, req_id: Hashable) -> None:
        """The request left the batch (finished or aborted): its response stays a draft source, a head's aside."""
        self.choice.forget(req_id)
        m = self._member.pop(req_id)
        self._run_cached[req_id] = m.run_seq
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
        p = g.prompts[m.prompt]
        p.running -= 1
        if p.running == 0:  # no request with it runs: it goes, as vLLM's request tree does
            g.tree.remove(p.seq)
            del g.prompts[m.prompt]
            g.prompt_tokens -= p.tokens
            self._tokens -= p.tokens
        self._evict()

    def propose(self, req_id: Hashable, context: np.ndarray | Sequence[int], max_tokens: int) -> Draft:
        """A draft of at most ``max_tokens`` after ``context`` (the request's last tokens)."""
        if max_tokens <= 0:
            return NO_DRAFT
        context = _int32(context[-MAX_TREE_DEPTH:])
        group = self._member[req_id].group
        self.groups.move_to_end(group)
        d = self.groups[group].tree.speculate_ndarray(context, max_tokens, GROUP_SPEC_FACTOR, 0.0, MIN_TOKEN_PROB,
                                                      False)
        group_draft = d.token_ids
        if len(group_draft) == max_tokens:  # the run's tree cannot go further: the group's, the run's unasked
            return self.choice.unopposed(req_id, Draft(group_draft, d.score, "group"))
        r = self.run.speculate_ndarray(context, max_tokens, RUN_SPEC_FACTOR, 0.0, MIN_TOKEN_PROB, False)
        return self.choice.choose(req_id, group_draft, d.score, r.token_ids, r.score)

    def verified(self, req_id: Hashable, output: Sequence[int]) -> None:
        """The step's output tokens of a row that drafted: what its next tokens were, for the choice of source."""
        self.choice.verified(req_id, output)

    def group_memory(self) -> int:
        """The group trees' bytes, at ``TREE_BYTES_PER_TOKEN``."""
        return TREE_BYTES_PER_TOKEN * self._tokens

    def run_memory(self) -> int:
        """The run's tree's bytes (its answers, and the responses running), at ``TREE_BYTES_PER_TOKEN``."""
        return TREE_BYTES_PER_TOKEN * self._run_total

    def memory(self) -> int:
        return self.run_memory() + self.group_memory()

    def _drop_sequence(self, g: _Group, seq: int) -> None:
        g.tree.remove(seq)
        dropped = g.tokens.pop(seq, 0)
        g.total -= dropped
        self._tokens -= dropped

    def _drop_run_answer(self, req_id: Hashable) -> None:
        seq = self._run_cached.pop(req_id)
        self.run.remove(seq)
        self._run_total -= self._run_tokens.pop(seq)

    def _evict(self) -> None:
        if self.memory() <= self.memory_bytes:
            return
        for key in list(self.groups):  # least recently used first
            g = self.groups[key]
            if g.running:
                continue
            self._tokens -= g.total + g.prompt_tokens
            del self.groups[key]
            if self.memory() <= self.memory_bytes:
                return


def _int32(tokens) -> np.ndarray:
    # vLLM's token rows already are: the common case skips the call
    if type(tokens) is np.ndarray and tokens.dtype == np.int32 and tokens.flags.c_contiguous:
        return tokens
    return np.ascontiguousarray(tokens, dtype=np.int32)
