"""Drafts in the replay: the product's drafters proposing for a replica's rows, as vLLM's model runner calls them.

After each engine step the rows the step scheduled (vLLM's ``InputBatch``: the finished ones gone, the others with
the tokens they just sampled) go to the drafter, and its drafts to the scheduler as the engine core hands them
(``Scheduler.update_draft_token_ids``). The drafters are the product's own, built from the config
``custom.speculative`` gives vLLM (``bench.drafters.Proposer``): vLLM's ``NgramProposer`` and
``SuffixDecodingProposer``, and ``GroupDrafter`` with its budget, told each request's group and predicted length
where the server tells it (``rollout.name=infinite``), and each step's modeled seconds and the modeled seconds of a
verified token, as in a run it measures the one and counts the other from the model's size.

A drafter's memory outlives a rollout step (its trees live in the worker): each step's drafter is first shown the
responses its replica finished in earlier steps (:meth:`ReplayDrafts.recall`, at most ``PAST_LIMIT``, the global
tree's own limit), as the one drafter of a real run would have seen them.

On a trace without tokens (``--spec-accept A``) a synthetic drafter stands in: each draft token is accepted with
probability A until the first rejection. ``ngram`` and ``suffix`` then draft ``K`` tokens on every row (a fixed
K), ``group`` what the product's ``DraftBudget`` gives each row from its verdicts. Figures from it are labelled
synthetic.

A host drafter's ``_oracle`` lane (``group_oracle``) is a bound, not a drafter: its proposals, drafted as long as
allowed, cut to the tokens verification will accept, its proposer charged only on rows left with a draft. No budget
of that drafter beats it: a budget can only draft less, or draft tokens that are rejected and cost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from verl_infsample.drafter.budget import StepCost

from ..bench.drafters import DRAFTERS, MODELED_DRAFTERS, OfflineBatch, Proposer

ORACLE = "_oracle"  # a host drafter's bound: its drafts cut to what verification accepts
SPECS = ("off", *DRAFTERS, *MODELED_DRAFTERS, *(d + ORACLE for d in DRAFTERS))
PAST_LIMIT = 10_000  # responses a replica's drafter recalls: vLLM's suffix_decoding_max_cached_requests default


def accepted_length(draft, position: int, max_tokens: int, token_at) -> int:
    """Leading tokens of ``draft`` that verification accepts for a sample at ``position``: those equal to its
    recorded next ones (``token_at(position)``), none past its end (one token is sampled after them)."""
    accepted = 0
    while (accepted < len(draft) and position + accepted + 1 < max_tokens
           and draft[accepted] == token_at(position + accepted)):
        accepted += 1
    return accepted


@dataclass(frozen=True)
class PastResponse:
    """A response a replica finished in an earlier step: its group (None: the server names none), prompt and ids."""

    group: str | None
    prompt: tuple[int, ...]
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class DraftSetup:
    """What drafts in a replay: ``method`` (``SPECS``), ``tokens`` per row at most (``speculative_tokens``), and
    ``accept`` (None: the drafters on the trace's recorded tokens; A: the synthetic drafter)."""

    method: str = "off"
    tokens: int = 8
    accept: float | None = None
    seed: int = 0

    def check(self) -> None:
        if self.method not in SPECS:
            raise ValueError(f"--spec {self.method!r}: choose from {', '.join(SPECS)}")
        if not 1 <= self.tokens <= 32:
            raise ValueError(f"--spec-tokens {self.tokens}: must be in 1..32 (custom.speculative_tokens)")
        if self.accept is not None and not 0 <= self.accept <= 1:
            raise ValueError(f"--spec-accept {self.accept}: a probability in [0, 1]")

    @property
    def on(self) -> bool:
        return self.method != "off"

    @property
    def oracle(self) -> bool:
        """The lane's drafts are cut to what verification accepts (a bound on the drafter's budgets)."""
        return self.method.endswith(ORACLE)

    @property
    def drafter(self) -> str:
        """The drafter that proposes (``group`` for ``group_oracle``), as the cost model charges it."""
        return self.method.removesuffix(ORACLE)

    @property
    def label(self) -> str:
        """``suffix``, or ``suffix@0.6`` for the synthetic drafter at acceptance 0.6."""
        return self.method if self.accept is None or not self.on else f"{self.method}@{self.accept:g}"

    def speculative_config(self) -> dict | None:
        """vLLM's config for the method; a modeled drafter gets ``ngram``'s (the scheduler reads only the tokens
        a row may draft)."""
        from verl_infsample.integration.settings import InfiniteRolloutSettings

        method = "ngram" if self.drafter in MODELED_DRAFTERS else self.drafter
        return InfiniteRolloutSettings(speculative=method, speculative_tokens=self.tokens).speculative_config()


class ReplayDrafts:
    """One replica's drafter: the rows of its vLLM's input batch, mirrored, and what proposes for them."""

    def __init__(self, setup: DraftSetup, max_model_len: int, max_num_seqs: int, token_of, cost=None):
        """``token_of(request_id, position)``: a request's recorded output token at ``position``; ``cost``: the
        replay's ``StepCostModel`` (None: drafts cost nothing)."""
        self.setup = setup
        self.method = setup.drafter
        self.token_of = token_of
        self.speculative_config = setup.speculative_config()
        self.batch = OfflineBatch(max_num_seqs, max_model_len + setup.tokens + 2)
        self.wall_s = 0.0  # measured here: the proposer's own calls
        # the budget weighs the proposer's time the replay charges, not this host's
        step_cost = (ModeledStepCost(token_s=cost.verify_token_seconds(),
                                     row_s=cost.propose_seconds(setup.drafter, 0, 1))
                     if cost is not None and not setup.oracle else None)  # the oracle drafts all it may
        if setup.accept is None:
            self.proposer = Proposer(setup.drafter, setup.tokens, max_model_len, max_num_seqs, step_cost)
        else:
            self.proposer = SyntheticDrafter(setup, token_of, step_cost)

    def recall(self, past: list[PastResponse]) -> None:
        """Show the drafter ``past`` (oldest first) as it saw them: each a request that ran and finished."""
        if self.setup.accept is not None or self.method == "ngram" or not past:
            return  # the synthetic drafter and ngram (the sample's own text) keep nothing
        rows, width = self.batch.token_ids_cpu.shape
        longest = max(len(r.prompt) + len(r.tokens) for r in past)
        if longest + 1 > width:
            self.batch = OfflineBatch(rows, longest + 1)
        for start in range(0, len(past), rows):
            chunk, hints = past[start:start + rows], {}
            for i, r in enumerate(chunk):
                rid = f"past-{start + i}"
                self.batch.add(rid, list(r.prompt))
                self.batch.append(i, list(r.tokens))
                if r.group is not None:
                    hints[rid] = _Hinted(r.group)
            self.proposer.propose(self.batch, [list(r.tokens) for r in chunk], hints)
            while self.batch.req_ids:
                self.batch.remove(len(self.batch.req_ids) - 1)
            self.proposer.propose(self.batch, [], {})  # gone from the batch: finished

    def step_took(self, seconds: float) -> None:
        """The step that verified the last drafts took ``seconds`` (modeled; the proposing before it included)."""
        self.proposer.step_took(seconds)

    def after_step(self, scheduler, ids: list[str], sampled: list[list[int]],
                   verified: dict[str, list[int]]) -> tuple[int, int]:
        """The step scheduled ``ids``, which sampled ``sampled``; ``verified``: the drafts it verified, by row.
        Proposes for the rows still running and hands the drafts to ``scheduler``; returns the decoding rows the
        proposer was called for and the rows it drafted for (its time in ``wall_s``)."""
        from vllm.v1.outputs import DraftTokenIds

        rows = [(rid, out) for rid, out in zip(ids, sampled)
                if rid in scheduler.requests and not scheduler.requests[rid].is_finished()]
        checked = [(rid, verified[rid], out) for rid, out in zip(ids, sampled) if verified.get(rid) and out
                   and verified[rid][0] >= 0]  # vLLM pads a resumed row's first step with -1: no draft of ours
        if checked:  # the drafter's time: what it learns from the verdicts, and its proposing below
            verdicts = ([r for r, _, _ in checked], [d for _, d, _ in checked],
                        [out + [-1] * (len(d) + 1 - len(out)) for _, d, out in checked])
            start = time.perf_counter()
            self.proposer.verified(*verdicts)
            self.wall_s += time.perf_counter() - start
        self._mirror(scheduler, rows)
        if not rows:
            return 0, 0
        before = self.proposer.proposing_rows
        in_order = [out for _, out in sorted(rows, key=lambda r: self.batch.req_id_to_index[r[0]])]
        start = time.perf_counter()
        drafts = self.proposer.propose(self.batch, in_order, scheduler.requests)
        self.wall_s += time.perf_counter() - start
        drafting = self.proposer.proposing_rows - before
        if self.setup.oracle:
            drafts = [self._accepted(scheduler.requests[rid], d) for rid, d in zip(self.batch.req_ids, drafts)]
            drafting = sum(1 for d in drafts if d)
        scheduler.update_draft_token_ids(DraftTokenIds(list(self.batch.req_ids), [list(d) for d in drafts]))
        return sum(1 for out in in_order if out), drafting

    def _accepted(self, request, draft) -> list[int]:
        """``draft`` up to its first token that verification would reject."""
        rid = request.request_id
        return [int(t) for t in draft[:accepted_length(draft, request.num_output_tokens, request.max_tokens,
                                                        lambda position: self.token_of(rid, position))]]

    @property
    def drafting_s(self) -> float | None:
        return getattr(self.proposer, "drafting_s", None)

    def pop_scanned_tokens(self) -> int:
        """Token ids a device drafter's matching read since the last call (0: a host drafter, or synthetic)."""
        impl = getattr(self.proposer, "impl", None)
        scanned = getattr(impl, "scanned_tokens", 0)
        if scanned:
            impl.scanned_tokens = 0
        return scanned

    def _mirror(self, scheduler, rows: list[tuple[str, list[int]]]) -> None:
        """The batch holds exactly ``rows``, in vLLM's way: rows that left are removed (the last moves into the
        freed place), new ones come with their tokens so far, staying ones append what they sampled."""
        keep = {rid for rid, _ in rows}
        for i in sorted((i for i, rid in enumerate(self.batch.req_ids) if rid not in keep), reverse=True):
            self.batch.remove(i)
        for rid, out in rows:
            i = self.batch.req_id_to_index.get(rid)
            if i is None:
                req = scheduler.requests[rid]
                self.batch.add(rid, list(req.prompt_token_ids))
                self.batch.append(len(self.batch.req_ids) - 1, list(req.output_token_ids))
            elif out:
                self.batch.append(i, out)


@dataclass
class ModeledStepCost(StepCost):
    """A step's cost as the replay charges it: the proposer's time a row is the cost model's, whatever the
    proposer took on this machine; the modeled seconds are trusted from the first step."""

    trusted_after: int = 1

    def proposed(self, seconds: float, drafting: int) -> None:
        pass


class _Hinted:
    """A request as the drafter reads its server's hints (``extra_args``)."""

    def __init__(self, group: str):
        from verl_infsample.drafter.hints import GROUP_ARG

        self.sampling_params = type("Params", (), {"extra_args": {GROUP_ARG: group}})()


class SyntheticDrafter:
    """Drafts whose tokens are accepted with probability ``accept`` each, until the first rejection: the first j
    are the row's recorded next tokens, the next one is not. ``group`` sizes each row's draft by the product's
    ``DraftBudget`` from the verdicts; ``ngram`` and ``suffix`` draft ``tokens`` on every row."""

    def __init__(self, setup: DraftSetup, token_of, cost: StepCost | None = None):
        from verl_infsample.drafter.budget import DraftPlanner

        self.setup = setup
        self.token_of = token_of
        self.planner = DraftPlanner(setup.tokens, cost)
        self.budgeted = setup.method.startswith("group")
        self.rng = np.random.default_rng(setup.seed)
        self.proposing_rows = 0

    def propose(self, batch: OfflineBatch, sampled: list[list[int]], requests=None) -> list[list[int]]:
        decoding = [i for i, out in enumerate(sampled) if out]
        done = {i: requests[batch.req_ids[i]].num_output_tokens for i in decoding}
        caps = [requests[batch.req_ids[i]].max_tokens - done[i] - 1 for i in decoding]  # one is sampled after them
        if self.budgeted:
            lengths = self.planner.plan([batch.req_ids[i] for i in decoding], caps)
        else:
            lengths = [min(self.setup.tokens, cap) for cap in caps]
        drafts: list[list[int]] = [[] for _ in sampled]
        for i, k in zip(decoding, lengths):
            if k <= 0:
                continue
            rid = batch.req_ids[i]
            self.proposing_rows += 1
            accepted = int(np.argmin(np.append(self.rng.random(k) < self.setup.accept, False)))
            truth = [self.token_of(rid, done[i] + j) for j in range(min(k, accepted + 1))]
            draft = truth[:accepted] + [truth[accepted] + 1] if accepted < k else truth
            drafts[i] = draft + [0] * (k - len(draft))
        for rid in [r for r in self.planner.acceptance.rows if r not in batch.req_id_to_index]:
            self.planner.forget(rid)
        return drafts

    def verified(self, req_ids, drafts, outputs) -> None:
        self.planner.verified(req_ids, drafts, outputs)

    def step_took(self, seconds: float) -> None:
        if self.budgeted:
            self.planner.step_took(seconds)
