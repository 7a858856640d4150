"""Drafts (``verl_infsample.drafter``): where they come from, how long they are, the run-time law check, and
``infsample eval-drafter`` on text whose answer is known."""

import json
import random
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infsample_lab.bench.drafters import OfflineBatch, evaluate
from verl_infsample.core.text_groups import PromptGroup, load_groups, make_tokenizer
from verl_infsample.drafter.budget import (STEPS_BEFORE_PRICING, DepthAcceptance, DraftBudget, RowAcceptance,
                                          StepCost)
from verl_infsample.drafter import GroupDrafter
from verl_infsample.drafter.drafting import Drafting
from verl_infsample.drafter.hints import GROUP_ARG, PREDICTED_ARG, RowHints
from verl_infsample.drafter.law_guard import LawTally, target_probabilities
from verl_infsample.drafter.source_choice import Draft, SourceChoice
from verl_infsample.drafter.trees import TREE_BYTES_PER_TOKEN, DraftTrees


def test_a_finished_sibling_drafts_the_rest_and_other_groups_draw_on_the_run():
    trees = DraftTrees()
    answer = list(range(100, 140))
    trees.start("a", "g", [1, 2, 3])
    trees.extend("a", answer)
    trees.stop("a")
    trees.start("b", "g", [1, 2, 3])
    trees.extend("b", answer[:10])
    draft = trees.propose("b", [1, 2, 3, *answer[:10]], 8)
    assert draft.token_ids == answer[10:18]
    trees.start("c", "h", [7, 7])  # another prompt: only the run's tree knows this text
    trees.extend("c", answer[:10])
    assert trees.propose("c", [7, 7, *answer[:10]], 8).source == "run"
    assert trees.propose("b", [1], 0).token_ids == []


def test_a_row_drafts_from_its_prompt_in_its_groups_tree_while_a_request_with_that_prompt_runs():
    """The prompt is in its group's tree once, however many of its requests run, and leaves with the last of them;
    a draft as long as asked from the group's tree is taken without the run's."""
    trees = DraftTrees()
    prompt = [5, 6, 7, 8, 9, 10]
    for rid in ("a", "b"):
        trees.start(rid, "g", prompt)
    trees.extend("a", [5, 6])
    draft = trees.propose("a", [*prompt, 5, 6], 4)
    assert draft.token_ids == [7, 8, 9, 10] and draft.source == "group"
    assert trees.groups["g"].tree.num_seqs() == 2 and trees.group_memory() == TREE_BYTES_PER_TOKEN * 8  # "b": none
    assert "a" not in trees.choice._offered  # unopposed: no parting to learn from
    trees.stop("a")
    assert trees.groups["g"].tree.num_seqs() == 2  # "b" runs with the prompt: it stays
    trees.stop("b")
    assert trees.groups["g"].tree.num_seqs() == 1 and trees.group_memory() == TREE_BYTES_PER_TOKEN * 2  # "a"'s answer


def test_group_trees_stay_within_their_memory_and_keep_running_groups():
    trees = DraftTrees(memory_bytes=1, group_responses=2)  # every finished group is over the limit at once
    rng = np.random.default_rng(0)
    trees.start("keep", "running", [1])
    trees.extend("keep", rng.integers(0, 1000, 200))
    for g in range(5):
        for r in range(3):
            trees.start(f"{g}/{r}", f"group{g}", [2])
            trees.extend(f"{g}/{r}", rng.integers(0, 1000, 200))
            trees.stop(f"{g}/{r}")
    assert list(trees.groups) == ["running"]  # least recently used and idle: dropped; the running one stays
    small = DraftTrees(group_responses=2)
    for r in range(5):
        small.start(r, "g", [1])
        small.extend(r, [r] * 5)
        small.stop(r)
    assert len(small.groups["g"].finished) == 2 and small.groups["g"].tree.num_seqs() == 2


def test_all_trees_together_stay_within_their_bytes_with_long_answers():
    """4,000-token answers, many prompts: the run's tree and the group trees together never pass ``memory_bytes``
    (counted at TREE_BYTES_PER_TOKEN), the run's tree at most half of it; the newest answers stay draft sources."""
    budget = 16 << 20  # 65,536 tokens' worth
    trees = DraftTrees(memory_bytes=budget)
    rng = np.random.default_rng(0)
    peak = 0
    for i in range(48):
        answer = rng.integers(0, 50_000, 4000)
        trees.start(i, f"p{i % 12}", rng.integers(0, 50_000, 300))
        trees.extend(i, answer)
        peak = max(peak, trees.memory())
        trees.stop(i)
        assert trees.memory() <= budget and trees.run_memory() <= budget // 2
    assert peak <= budget + 2 * TREE_BYTES_PER_TOKEN * 4300  # the running answer (both trees) until it stops
    assert trees.run.num_seqs() == len(trees._run_cached) < 48  # what is counted is what the tree holds
    trees.start("next", "p11", [1])
    trees.extend("next", answer[:30])
    assert trees.propose("next", [1, *answer[:30]], 8).token_ids == answer[30:38].tolist()  # the newest answer


def _rows(*rates, verdicts: float = 1e12):
    """Rows whose own verdicts (``verdicts`` of them) give each its rate: the batch's beside them weighs nothing."""
    return [RowAcceptance(accepted=r * verdicts, tested=verdicts) for r in rates]


def _depth(after_first: float, tokens: int = 8, verdicts: int = 4000) -> DepthAcceptance:
    """The batch's counts by position after ``verdicts`` drafts of ``tokens`` whose first token was accepted and
    each later one with probability ``after_first`` given the one before."""
    depth, rng = DepthAcceptance(tokens), np.random.default_rng(0)
    for _ in range(verdicts // 20):  # steps of 20 rows
        depth.verified([tokens] * 20, [1 + int(np.argmin(np.append(rng.random(tokens - 1) < after_first, False)))
                                       for _ in range(20)])
    return depth


def _budget(fixed_s: float, token_s: float, row_s: float = 0.0, retry_every: int = 10**9) -> DraftBudget:
    """A budget that has seen steps whose fixed part took ``fixed_s``."""
    cost = StepCost(token_s=token_s, row_s=row_s)
    for _ in range(STEPS_BEFORE_PRICING):
        cost.step_took(fixed_s, 0, 0)
    return DraftBudget(max_tokens=8, cost=cost, retry_every=retry_every)


def test_the_budget_drafts_long_in_a_thin_tail_and_only_likely_tokens_where_drafts_cost():
    """An 8B model on an H100, as the step model has it: 15 ms a step beside its tokens, 20 us a verified token."""
    assert DraftBudget(max_tokens=8).plan(_rows(*[0.01] * 16)) == [8] * 16  # no step timed yet: drafts are free
    budget = _budget(15e-3, 20e-6, retry_every=3)
    assert budget.plan(_rows(*[0.9] * 16), depth=_depth(0.9)) == [8] * 16  # a thin tail: the fixed part dominates
    assert budget.plan(_rows(0.9, 0.9), caps=[3, 20], depth=_depth(0.9)) == [3, 8]  # no further than its end
    full = budget.plan(_rows(*[0.9] * 100, *[0.3] * 100), depth=_depth(0.9))
    assert min(full[:100]) >= 3 and max(full[100:]) == 0  # a full batch: the likely tokens of the likely rows
    assert budget.planned == (200 + sum(full), 100)
    assert max(budget.plan(_rows(*[0.9] * 400), depth=_depth(0.2))) == 1  # deeper tokens do not pay their GEMMs
    slow_proposer = _budget(15e-3, 20e-6, row_s=1e-3)
    assert sum(slow_proposer.plan(_rows(*[0.9] * 100, *[0.3] * 100), depth=_depth(0.9))) == 0
    lost = _rows(*[0.9] * 300, 0.0)
    assert [budget.plan(lost, depth=_depth(0.9))[-1] for _ in range(5)] == [0, 0, 1, 0, 0]  # retries every 3 steps
    row = RowAcceptance()
    assert row.rate(0.3) == 0.3  # a new row: the batch's rate
    row.verified(4, 0)
    assert row.rate(0.3) == pytest.approx(1.2 / 5)  # one rejection: a fifth of the way to 0
    row.verified(0, 0)  # nothing verified: nothing learned
    assert row.rate(0.3) == pytest.approx(1.2 / 5)
    learned, depth = RowAcceptance(), DepthAcceptance(6)
    rng = np.random.default_rng(0)
    for _ in range(400):  # geometric verdicts at a = 0.6, 6 tokens drafted: every position's acceptance comes out
        accepted = int(np.argmin(np.append(rng.random(6) < 0.6, False)))
        learned.verified(6, accepted)
        depth.verified([6, 0], [accepted, 0])  # a row that drafted nothing tells nothing
    assert abs(learned.rate(0.6) - 0.6) < 0.15 and abs(depth.first() - 0.6) < 0.06
    assert np.allclose(depth.after_first(6), 0.6 ** np.arange(6), atol=0.06)
    # a row that keeps accepting stands above a batch that does not, and one that keeps failing below it
    lucky, unlucky = RowAcceptance(), RowAcceptance()
    for _ in range(10):
        lucky.verified(4, 2)
        unlucky.verified(4, 0)
    assert lucky.rate(0.3) > 0.4 and unlucky.rate(0.3) < 0.25


def test_at_a_low_even_acceptance_rows_keep_drafting_where_the_batch_says_one_token_pays():
    """Every row accepts a first token at 0.3, where one token a row pays for its GEMM (a full batch: 200 rows,
    15 ms a step beside 20 us a verified token): after their first verdicts, most rows still draft, though most saw
    a rejection; on its own verdicts alone a row that saw one would stop."""
    from verl_infsample.drafter.budget import DraftPlanner

    planner = DraftPlanner(4, _budget(30e-3, 20e-6).cost)
    rng = np.random.default_rng(0)
    ids = [f"r{i}" for i in range(200)]
    drafting = []
    for _ in range(20):
        plan = planner.plan(ids, [4] * len(ids))
        drafting.append(sum(k > 0 for k in plan))
        drafts = [[7] * k for k in plan]
        outputs = [[7 if rng.random() < 0.3 else 8] + [8] * k for k in plan]  # the first token at 0.3, then not
        planner.verified(ids, drafts, outputs)
    assert min(drafting[5:]) > 0.8 * len(ids)


def test_the_step_cost_learns_the_fixed_part_and_the_proposers_time_from_what_steps_took():
    cost = StepCost(token_s=20e-6)
    assert cost.fixed_s is None and cost.seconds(100, 0) > 1e6  # unknown: drafts cost nothing beside it
    for _ in range(STEPS_BEFORE_PRICING - 1):
        cost.step_took(1e-6, 300, 0)  # steps that took no time (a stand-in runner): not trusted yet
    assert cost.fixed_s is None and cost.steps_timed == STEPS_BEFORE_PRICING - 1
    cost = StepCost(token_s=20e-6)
    for _ in range(10):
        cost.step_took(15e-3 + 20e-6 * 300, 300, 0)
    cost.step_took(30.0, 300, 0)  # the engine idled between two rollout steps: one outlier, the median holds
    assert cost.fixed_s == pytest.approx(15e-3)
    cost.proposed(4.8e-3, 100)
    assert cost.row_s == pytest.approx(48e-6)
    cost.proposed(0.0, 0)  # nobody proposed: nothing learned
    cost.proposed(2.4e-3, 100)
    assert 24e-6 < cost.row_s < 48e-6
    assert cost.seconds(400, 100) == pytest.approx(cost.fixed_s + 400 * 20e-6 + 100 * cost.row_s)
    free = StepCost()
    for _ in range(STEPS_BEFORE_PRICING):
        free.step_took(0.0, 10, 0)
    assert free.seconds(10, 0) > 0  # a step timed at nothing never divides by zero
    assert DraftBudget(max_tokens=4, cost=free).plan(_rows(0.9, 0.9)) == [4, 4]


def test_the_budgets_token_price_is_the_step_models_within_a_tenth():
    """The product prices a verified token from the model's parameters; the replay's step model from its GEMMs."""
    from infsample_lab.replay.hardware import GPUS, MODELS, StepCostModel
    from verl_infsample.drafter.budget import VERIFY_S_PER_PARAM

    for name in ("qwen3-1.7b", "qwen3-8b", "llama-3.1-8b", "qwen3-32b"):
        for gpu in ("h100", "h200"):
            modeled = StepCostModel(GPUS[gpu], MODELS[name]).verify_token_seconds()
            assert VERIFY_S_PER_PARAM * MODELS[name].params == pytest.approx(modeled, rel=0.1), (name, gpu)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4), st.integers(1, 3), st.floats(1e-4, 1.0),
       st.floats(0.0, 0.1), st.floats(0.0, 0.1), st.floats(0.0, 1.0))
def test_the_budgets_plan_is_the_best_draft_lengths_by_brute_force(rates, depth, fixed_s, token_s, row_s,
                                                                  after_first):
    """Expected tokens per second, a step ``fixed_s + token_s * verified + row_s * rows that draft``, the j-th
    token of a row with first-token rate a gaining a times the batch's acceptance of tokens 2..j: no draft lengths
    do better."""
    import itertools

    budget = _budget(fixed_s, token_s, row_s)
    budget.max_tokens = depth
    by_position = _depth(after_first, tokens=depth, verdicts=50)
    reach = by_position.after_first(depth)

    def value(ks):
        tokens = sum(1 + a * sum(reach[:k]) for a, k in zip(rates, ks))
        return tokens / (fixed_s + token_s * sum(1 + k for k in ks) + row_s * sum(k > 0 for k in ks))

    best = max(value(ks) for ks in itertools.product(range(depth + 1), repeat=len(rates)))
    assert value(budget.plan(_rows(*rates), depth=by_position)) == pytest.approx(best, rel=1e-6)


def test_a_row_takes_the_draft_that_goes_on_else_the_one_that_won_its_partings_else_the_better_scored():
    choice = SourceChoice()

    def choose(req_id, group: Draft, run: Draft) -> str:
        """The source the row takes."""
        return choice.choose(req_id, group.token_ids, group.score, run.token_ids, run.score).source

    group, run = Draft([1, 2, 3, 4], 1.0, "group"), Draft([1, 2], 3.0, "run")
    assert choose("a", group, run) == "group"  # the run's draft stops where the group's goes on
    assert choose("a", Draft([1, 2], 1.0, "group"), run) == "run"  # the same draft: vLLM's
    group, run = Draft([1, 2, 7], 1.0, "group"), Draft([1, 5], 2.0, "run")
    assert choose("a", group, run) == "run"  # they part: the better-scored, with no partings won yet
    for _ in range(3):  # each wins a parting in turn (the step's output: accepted tokens, one sampled, placeholders)
        choose("a", group, run)
        choice.verified("a", [1, 5, 9, -1])  # the run's draft would have been accepted further
        choose("a", group, run)
        choice.verified("a", [1, 2, 7, -1])  # the group's
    assert choose("a", group, run) == "run"  # neither ahead by the margin: the scores decide
    for _ in range(3):
        choose("a", group, run)
        choice.verified("a", [1, 2, 7, 8])
    assert choose("a", group, run) == "group"  # three more won by the group's: they overrule the scores
    assert choose("b", group, run) == "run"  # each row its own
    for _ in range(40):
        choose("a", group, run)
        choice.verified("a", [1, 5, 9, -1])
    assert choose("a", group, run) == "run"
    for _ in range(12):  # old wins fade
        choose("a", group, run)
        choice.verified("a", [1, 2, 7, 8])
    assert choose("a", group, run) == "group"
    choice.forget("a")  # the request left: its record goes
    assert choose("a", group, run) == "run"


def test_the_law_check_is_quiet_where_acceptance_follows_the_target_and_alarms_where_it_does_not():
    rng = random.Random(0)
    fair, skewed = LawTally(), LawTally()
    for _ in range(3000):
        p = rng.random()
        fair.add(rng.random() < p, p)
        skewed.add(rng.random() < min(1.0, p + 0.15), p)
    assert not fair.alarm and abs(fair.z) < 4 and abs(fair.gap) < 0.02
    assert skewed.alarm and skewed.gap > 0.1
    assert not LawTally(tested=10, accepted=10, expected=0.0, variance=0.01).alarm  # too few to judge

    import torch

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    p = target_probabilities(logits, torch.tensor([0.5, 1.0]), torch.tensor([2, 4]), None, torch.tensor([1, 3]))
    top2 = torch.softmax(torch.tensor([4.0, 2.0]), 0)  # temperature 0.5, the two best kept
    assert p[0] == pytest.approx(float(top2[1])) and p[1] == pytest.approx(0.25)


def test_the_law_checks_probabilities_are_vllms_rule_written_apart():
    """The guard's target probabilities (its own top-k and top-p) equal what vLLM's own top-k/top-p and softmax give
    on random logits, row by row with its own parameters, top-k and top-p off in some rows."""
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    g = torch.Generator().manual_seed(3)
    logits = 3 * torch.randn(12, 500, generator=g)
    temperature = torch.rand(12, generator=g) + 0.3
    top_k = torch.tensor([5, 500, 40, 1, 0, 77, 500, 3, 250, 500, 9, 20])
    top_p = torch.tensor([1.0, 0.9, 0.5, 1.0, 0.8, 0.95, 0.3, 0.7, 1.0, 0.6, 0.99, 0.85])
    tokens = torch.stack([torch.argsort(row, descending=True)[i % 7] for i, row in enumerate(logits)])
    ours = target_probabilities(logits, temperature, top_k, top_p, tokens)
    k_vllm = torch.where(top_k <= 0, torch.full_like(top_k, 500), top_k)
    theirs = torch.softmax(apply_top_k_top_p_pytorch(logits / temperature[:, None], k_vllm, top_p), -1)
    assert torch.allclose(ours, theirs.gather(-1, tokens[:, None])[:, 0], atol=1e-6)
    assert (ours > 0).any() and (ours == 0).any()  # kept and cut tokens both among them


class _DrafterConfig:
    """The parts of vLLM's config the drafter reads."""
    speculative_config = type("S", (), {"num_speculative_tokens": 4})
    model_config = type("M", (), {"max_model_len": 64})


def _told(**hints):
    """What the server told the drafter of a request (``drafter.hints``)."""
    return RowHints(**hints)


def _batch(rows):
    batch = OfflineBatch(len(rows), 64)
    for req_id, prompt, output in rows:
        batch.add(req_id, prompt)
        batch.append(len(batch.req_ids) - 1, output)
    return batch


def test_the_drafter_groups_rows_by_prompt_or_by_the_servers_word_and_learns_from_verdicts():
    drafter = Drafting(4, 64)
    answer = [50, 51, 52, 53, 54, 55, 56, 57]
    drafter.propose_batch(_batch([("a", [1, 2], answer)]), [answer[-1:]])  # a sibling decoded the whole answer
    drafter.propose_batch(_batch([]), [])  # ... and left
    solo = Drafting(4, 64)
    drafts = drafter.propose_batch(_batch([("b", [1, 2], answer[:3])]), [answer[2:3]])
    assert drafts == [answer[3:7]]  # same prompt: its group
    drafter.verified(["b"], drafts, [answer[3:6] + [99, -1]])
    assert drafter.stats.drafted == 4 and drafter.stats.accepted == 3
    depth = drafter.planner.acceptance.depth  # by position: accepted, and tested (up to and including the first rejection)
    assert depth.accepted.tolist() == [1, 1, 1, 0] and depth.tested.tolist() == [1, 1, 1, 1]
    assert drafter.planner.acceptance.rows["b"].rate(depth.first()) > 0.5
    # the server names the group: rows of different prompts draft from each other's answers
    solo.propose_batch(_batch([("x", [9], answer)]), [answer[-1:]], {"x": _told(group="g")})
    solo.propose_batch(_batch([]), [])
    solo.trees._drop_run_answer("x")  # only the group's tree knows the answer now
    assert solo.propose_batch(_batch([("y", [8], answer[:2])]), [answer[1:2]],
                              {"y": _told(group="g")}) == [answer[2:6]]
    assert solo.stats.from_group == 1 and solo.pop_stats().proposing_rows == 2 and solo.stats.rows == 0


def test_a_sample_drafts_to_its_predicted_end_and_past_it_once_it_outlives_its_prediction():
    drafter = Drafting(4, 64)
    answer = list(range(50, 62))
    drafter.propose_batch(_batch([("a", [1, 2], answer)]), [answer[-1:]], {"a": _told(group="g", predicted=12)})
    drafter.propose_batch(_batch([]), [])
    rows = _batch([("near", [1, 2], answer[:3]), ("over", [1, 2], answer[:3])])
    drafts = drafter.propose_batch(rows, [answer[2:3]] * 2, {"near": _told(group="g", predicted=5),
                                                               "over": _told(group="g", predicted=2)})
    # 3 generated: "near" ends in 2 more tokens by its prediction; "over" has outlived its prediction, which then
    # says nothing of how far it goes
    assert drafts == [answer[3:5], answer[3:7]]


def test_a_probed_sample_is_one_answer_and_its_rest_counts_its_response_from_the_first_prompt():
    """A probe (a head) and its rest, whose prompt carries the probe's tokens, are one sample: the group's tree keeps
    one answer of every token (the probe's alone is none), and the rest's predicted end counts the probe's tokens
    as response, not prompt."""
    answer = list(range(50, 62))
    drafter = Drafting(4, 64)
    drafter.propose_batch(_batch([("s-probe", [1, 2], answer[:4])]), [answer[3:4]],
                          {"s-probe": _told(group="g", predicted=12, head=True)})
    drafter.propose_batch(_batch([]), [])  # the probe ends: its rest goes on
    group = drafter.trees.groups["g"]
    assert not group.finished and group.total == 0  # a head leaves nothing behind
    rest = _told(group="g", predicted=12, response_start=2)
    drafter.propose_batch(_batch([("s", [1, 2, *answer[:4]], answer[4:])]), [answer[-1:]], {"s": rest})
    drafter.propose_batch(_batch([]), [])
    assert len(group.finished) == 1 and group.total == len(answer)  # one answer, the probe's tokens in it
    # a rest 5 tokens into a sample predicted at 7 (2 of them its probe's): 2 to go
    rows = _batch([("t", [1, 2, *answer[:2]], answer[2:5])])
    assert drafter.propose_batch(rows, [answer[4:5]], {"t": _told(group="g", predicted=7, response_start=2)}) == [
        answer[5:7]]


def test_under_tensor_parallelism_one_worker_drafts_and_counts_for_the_engine():
    """vLLM reads only the drafts of an engine's first tensor-parallel worker (and sends every worker the drafts it
    scheduled): the other workers keep no trees, draft nothing, leave the sampler alone and report nothing, so the
    engine's figures and law tally are the same at TP=1, 4 and 8. (Each worker counting the same verdicts made the
    law check's z grow with sqrt(TP): false alarms.)"""
    import asyncio

    from verl_infsample.integration.rollout.vllm.drafts import DraftReport
    from verl_infsample.drafter import pop_drafter_stats

    answer = [50, 51, 52, 53, 54, 55, 56, 57]

    class Runner:
        def __init__(self, rows):
            self.input_batch, self.requests = _batch(rows), {}
            self.rejection_sampler = type("Sampler", (), {"forward": None})()  # its own, as each worker's

    def engine(tp: int) -> dict:
        workers = []
        for rank in range(tp):
            drafter = GroupDrafter(_DrafterConfig(), runner=Runner([("a", [1, 2], answer)]), read_here=rank == 0)
            drafter.propose([answer[-1:]])  # a sibling decoded the whole answer ...
            drafter.runner = Runner([("b", [1, 2], answer[:3])])
            drafts = drafter.propose([answer[2:3]])  # ... and the next one drafts from it
            if drafter.read_here:
                assert drafts == [answer[3:7]] and drafter.runner.rejection_sampler.forward is not None
                drafter.drafting.verified(["b"], drafts, [answer[3:6] + [99, -1]], [[0.9, 0.8, 0.7, 0.6]])
            else:
                assert drafts == [[]] and drafter.drafting is None and drafter.runner.rejection_sampler.forward is None
            workers.append(type("Worker", (), {"model_runner": type("MR", (), {"drafter": drafter})})())

        async def rpc(method):
            assert method == "infsample_pop_drafter_stats"
            return [pop_drafter_stats(w) for w in workers]

        metrics = asyncio.run(DraftReport("group").pop_metrics(rpc))
        assert metrics.pop("infsample/spec_drafter_ms_per_step") > 0  # a time: it differs from run to run
        return metrics

    one = engine(1)
    assert one["infsample/spec_law_tested"] == 4 and one["infsample/spec_rows"] == 2  # a row in each step
    assert one["infsample/spec_group_tree_mb"] > 0
    assert engine(4) == engine(8) == one


@pytest.mark.parametrize("law_guard", ["warn", "off_drafts", "fail"])
def test_when_verification_moves_the_law_the_guard_does_what_the_setting_says(law_guard, caplog):
    """The tally is read at every weight sync (``collect``, every trainer mode) and with the step's figures. Drafts
    accepted far more often than their target probabilities: ``warn`` logs it, ``off_drafts`` logs it and stops the
    workers' drafts for the rest of the run, ``fail`` stops the run with a message naming what moved and the fix."""
    import asyncio

    from verl_infsample.integration.rollout.vllm.drafts import DraftReport, LawMoved

    calls = []
    moved = LawTally()
    for _ in range(2000):
        moved.add(True, 0.5)  # every tested token accepted where half were to be

    async def rpc(method):
        calls.append(method)
        if method == "infsample_pop_drafter_stats":
            stats = {"steps": 1, "propose_s": 0.001, "proposing_rows": 1, "rows": 1, "from_group": 0,
                     "group_bytes": 0, "tree_bytes": 0, "law": moved.__dict__}
            return [stats, None]  # the second worker's drafts are not read: it reports nothing
        return [None, None]

    report = DraftReport("group", law_guard)
    if law_guard == "fail":
        with pytest.raises(LawMoved, match="moves the sampled law.*law_guard=fail.*speculative=off"):
            asyncio.run(report.collect(rpc))
        return
    asyncio.run(report.collect(rpc))  # a weight sync
    assert ("infsample_halt_drafter" in calls) == (law_guard == "off_drafts")
    assert "moves the sampled law" in caplog.text
    metrics = asyncio.run(report.pop_metrics(rpc))
    assert metrics["infsample/spec_law_alarm"] == 1.0 and metrics["infsample/spec_law_tested"] == 4000
    assert metrics["infsample/spec_drafts_halted"] == float(law_guard == "off_drafts")
    assert calls.count("infsample_halt_drafter") <= 1 and caplog.text.count("moves the sampled law") == 1


def test_a_halted_drafter_drafts_nothing():
    from verl_infsample.drafter import halt_drafter

    drafter = GroupDrafter(_DrafterConfig(), runner=type("R", (), {"input_batch": _batch([("a", [1], [2])]),
                                                                   "requests": {}})())
    halt_drafter(type("W", (), {"model_runner": type("MR", (), {"drafter": drafter})})())
    assert drafter.propose([[2]]) == [[]] and drafter.drafting.stats.rows == 0


def test_a_row_that_leaves_and_comes_back_keeps_its_answer_once_and_a_row_that_ends_leaves_no_tokens_behind():
    """A row vLLM preempts leaves the batch but not vLLM's requests: the trees keep it running, no partial answer is
    stored as finished; back in the batch it goes on in the same sequence. A row that did not draft hands its
    tokens to the trees in runs; when it ends, its last tokens (less than a run) reach them too."""
    drafter = Drafting(4, 64)
    budget = drafter.planner.budget
    drafter.planner.budget = _budget(1e-3, 0.0, row_s=1.0)  # a proposer far slower than a step: no row drafts
    answer = list(range(50, 61))  # 11 tokens: one run of 8, and 3 left over
    preempted = {"a": _told(group="g")}
    drafter.propose_batch(_batch([("a", [1, 2], answer[:4])]), [answer[3:4]], preempted)
    drafter.propose_batch(_batch([]), [], preempted)  # preempted: out of the batch, still vLLM's
    assert "a" in drafter.rows and "a" in drafter.trees.active and not drafter.trees.groups["g"].finished
    drafter.propose_batch(_batch([("a", [1, 2], answer)]), [answer[-1:]], preempted)  # back, and to its end
    drafter.propose_batch(_batch([]), [], {})  # finished: gone from vLLM's requests
    group = drafter.trees.groups["g"]
    assert len(group.finished) == 1 and group.total == len(answer)  # stored once, every token of it
    assert drafter.trees.run_memory() == TREE_BYTES_PER_TOKEN * len(answer)  # in the run's tree too
    drafter.planner.budget = budget
    sibling = {"b": _told(group="g")}
    drafts = drafter.propose_batch(_batch([("b", [1, 2], answer[:6])]), [answer[5:6]], sibling)
    assert drafts == [answer[6:10]]  # the answer's end, which came after its last run of 8


def test_the_law_check_raises_no_false_alarm_in_a_thousand_runs_of_a_right_sampler():
    """A right sampler accepts each tested draft token with its target probability. 1,000 runs of 300 checked steps
    (16 tokens each, probabilities spread over (0, 1)), the run's tally read after every step as the server reads
    it: no run raises the alarm (the bound asked is at most 1 in 1,000). With one engine's tally per engine (one
    worker reports, whatever the tensor parallelism: the test above) this holds at every TP. A sampler whose
    acceptance is off by 0.05 is caught in at least 95% of the runs."""
    rng = np.random.default_rng(11)
    runs, steps, tokens = 1000, 300, 16
    p = rng.beta(2, 2, (runs, steps, tokens))
    for shift in (0.0, 0.05):
        accepted = rng.random((runs, steps, tokens)) < np.clip(p + shift, 0, 1)
        alarmed = 0
        for r in range(runs):
            tally = LawTally()
            for t in range(steps):
                tally.merge(LawTally(tokens, int(accepted[r, t].sum()), float(p[r, t].sum()),
                                     float((p[r, t] * (1 - p[r, t])).sum())))
                if tally.alarm:
                    alarmed += 1
                    break
        assert alarmed == 0 if shift == 0 else alarmed >= 0.95 * runs, (shift, alarmed)


def test_the_law_check_leaves_out_rows_whose_law_something_else_shapes():
    """Rows the check tests are sampled from temperature, top-k and top-p alone, read from each request on the host:
    not greedy ones, not those whose draft positions may fall under ``min_tokens`` (the end of the sequence is
    masked there), not those with a thinking budget."""
    from types import SimpleNamespace

    from verl_infsample.drafter.vllm_adapter import _plain_sampling

    def request(output=20, **params):
        base = dict(temperature=1.0, top_k=0, top_p=1.0, min_tokens=0, thinking_token_budget=None)
        return SimpleNamespace(sampling_params=SimpleNamespace(**{**base, **params}), output_token_ids=[7] * output)

    assert _plain_sampling(request(top_k=50, top_p=0.9, temperature=0.7), 4) == (0.7, 50, 0.9)
    assert _plain_sampling(request(top_k=-1), 4) == (1.0, 0, 1.0)  # vLLM 0.24's "off"
    assert _plain_sampling(request(temperature=0.0), 4) is None
    assert _plain_sampling(request(output=3, min_tokens=10), 4) is None
    assert _plain_sampling(request(output=14, min_tokens=10), 4) == (1.0, 0, 1.0)  # past it, drafts and all
    assert _plain_sampling(request(thinking_token_budget=256), 4) is None
    assert _plain_sampling(None, 4) is None


def test_a_request_verl_resumes_after_an_abort_drafts_with_its_group():
    """verl resumes an aborted request under its id, the partial answer appended to its prompt: the drafter hears
    the group and response start of its first arrival (the partial answer is response, not prompt; its predicted
    length counts it), not a new group of the longer prompt; a request that completed is forgotten, and so is the
    oldest aborted one past ``KEPT``."""
    from verl_infsample.drafter.hints import RESPONSE_START_ARG, DraftHints

    hints = DraftHints()
    first = hints.arrive("r1", 20, "g")
    assert first.extra_args(300) == {GROUP_ARG: "g", PREDICTED_ARG: 300}
    hints.ended("r1", first, "aborted")
    again = hints.arrive("r1", 20 + 120, "another")
    assert again.extra_args(50) == {GROUP_ARG: "g", PREDICTED_ARG: 170, RESPONSE_START_ARG: 20}
    hints.ended("r1", again, "completed")
    assert hints.arrive("r1", 30, "h").extra_args(90) == {GROUP_ARG: "h", PREDICTED_ARG: 90}  # an id used anew
    hints.KEPT = 2
    for i in range(3):
        hints.ended(f"a{i}", hints.arrive(f"a{i}", 10, f"g{i}"), "abort")
    assert hints.arrive("a0", 60, "x").group == "x"  # the oldest was forgotten
    assert hints.arrive("a2", 60, "x").extra_args(7) == {GROUP_ARG: "g2", PREDICTED_ARG: 57, RESPONSE_START_ARG: 10}


def _groups_file(tmp_path, shared: bool):
    rng = random.Random(1)
    lines = []
    for p in range(6):
        base = [f"w{rng.randrange(40)}" for _ in range(40)]
        responses = []
        for _ in range(6):
            r = list(base) if shared else [f"w{rng.randrange(40)}" for _ in range(40)]
            for _ in range(4):
                r[rng.randrange(len(r))] = f"w{rng.randrange(40)}"
            responses.append(" ".join(r))
        lines.append(json.dumps({"prompt_id": f"p{p}", "prompt": f"question {p}", "responses": responses}))
    path = tmp_path / ("shared.jsonl" if shared else "random.jsonl")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_eval_drafter_ranks_drafters_on_text_whose_siblings_agree(tmp_path):
    path = _groups_file(tmp_path, shared=True)
    out = subprocess.run([sys.executable, "-m", "verl_infsample.cli", "eval-drafter", "--groups", str(path),
                          "--drafter", "ngram,suffix,group", "--history", "2", "--wave", "3", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {r["drafter"]: r for r in map(json.loads, [ln for ln in out.stdout.split("\n") if ln.startswith("{")])}
    assert set(rows["group"]) >= {"drafter", "tokens_per_step", "drafted_per_step", "propose_us_per_row",
                                  "responses", "tokens"}
    assert rows["group"]["responses"] == 6 * 4 and rows["group"]["tokens"] == 6 * 4 * 40
    assert rows["group"]["tokens_per_step"] >= rows["suffix"]["tokens_per_step"] > 1.5
    assert rows["suffix"]["tokens_per_step"] > rows["ngram"]["tokens_per_step"]
    noise = evaluate(load_groups(_groups_file(tmp_path, shared=False), make_tokenizer("words")), "group")
    assert noise.tokens_per_step < rows["group"]["tokens_per_step"]


def test_the_device_matching_drafts_from_the_group_then_the_row_then_the_run():
    """``group_gpu``'s matching (a device drafter that does not ship, measured to decide whether to build it): a
    row's last tokens looked up in its group's answers and running rows, its own text, then the run's answers; the
    continuation most occurrences agree on; never the row's own tail, never past a text's end."""
    from infsample_lab.bench.group_match import SEPARATOR, GroupMatchDrafter, first_match

    source = np.array([1, 2, 3, 9, SEPARATOR, 1, 2, 3, 4, 5, SEPARATOR, 1, 2, 3, 4, 6, SEPARATOR])
    assert first_match(source, np.array([2, 3]), 3) == [4, 5]  # 4 follows twice, 9 once; then a tie: the first
    assert first_match(source, np.array([9]), 3) == []  # only a separator after it
    assert first_match(source, np.array([7, 7]), 3) == []
    drafter = GroupMatchDrafter(k=4)
    answer = [50, 51, 52, 53, 54, 55, 56, 57]
    batch = OfflineBatch(4, 64)
    batch.add("a", [1, 2])
    batch.append(0, answer)
    drafter.propose(batch, [answer[-1:]])
    batch.remove(0)  # "a" finished: its answer is its group's and the run's
    for rid, prompt, start in (("b", [1, 2], answer[:3]), ("c", [7, 7], answer[:3]), ("d", [1, 2], [60, 50, 51])):
        batch.add(rid, prompt)
        batch.append(len(batch.req_ids) - 1, start)
    drafts = drafter.propose(batch, [[52], [52], [51]])
    assert drafts[0] == answer[3:7]  # its group's answer
    assert drafts[1] == answer[3:7]  # another prompt: the run's answers
    assert drafts[2] == answer[2:6]  # its group's answer, at a shorter match ([50, 51])
    assert drafter.scanned_tokens > 0 and drafter.proposing_rows == 3
    alone = GroupMatchDrafter(k=4)
    batch = OfflineBatch(1, 64)
    batch.add("e", [3, 4, 5])
    batch.append(0, [9, 3, 4])
    assert alone.propose(batch, [[4]]) == [[5, 9, 3, 4]]  # its own text, its prompt too, not its own tail


def test_eval_drafter_names_what_is_wrong_with_its_input(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_id": 1, "prompt": "q", "responses": ["a b"]}\n{"prompt": "q", "responses": []}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: missing key 'prompt_id'"):
        load_groups(bad, make_tokenizer("words"))
    bad.write_text('{"prompt_id": 1, "prompt": "q", "responses": "a b"}\n')
    with pytest.raises(ValueError, match="responses must be a list of strings"):
        load_groups(bad, make_tokenizer("words"))
    with pytest.raises(ValueError, match="neither 'words' nor a model folder"):
        make_tokenizer(str(tmp_path / "nowhere"))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.lists(st.integers(0, 7), max_size=30), min_size=1, max_size=5), min_size=1, max_size=4),
       st.integers(0, 3), st.integers(1, 3), st.integers(1, 6))
def test_any_text_is_decoded_whole_by_every_drafter(groups, history, wave, max_draft):
    """Odd input (empty responses, one-token answers, repeats): each drafter decodes every measured token once."""

    parts = [PromptGroup(f"p{i}", [i], [r for r in g if r]) for i, g in enumerate(groups)]
    parts = [g for g in parts if g.responses]
    if not parts:
        return
    want = sum(len(r) for g in parts for r in g.responses[history:])
    for method in ("suffix", "group", "group_gpu"):
        result = evaluate(parts, method, history=history, wave=wave, max_draft=max_draft)
        assert result.tokens == want
        assert 1.0 <= result.tokens_per_step <= max_draft + 1 or result.tokens == 0


def test_the_vllm_adapter_reads_a_steps_rows_and_the_samplers_verdicts_and_law_inputs():
    """The adapter's contacts with vLLM, one step through: ``propose`` with the arrays vLLM hands it (request ids
    and prompt lengths from the runner's batch, hints from its requests), the rejection sampler wrapped once, its
    verdicts and the law's target probabilities (vLLM's ``SpecDecodeMetadata``; uniform logits: p = 1/vocab) read
    at the next proposal. The sampler and the runner are stand-ins (their verdicts are the test's): the real ones
    run in the sampled-law test."""
    from types import SimpleNamespace

    import torch
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    from verl_infsample.drafter.budget import VERIFY_S_PER_PARAM
    from verl_infsample.drafter.law_guard import CHECK_EVERY

    answer = list(range(50, 62))
    params = SimpleNamespace(temperature=1.0, top_k=0, top_p=1.0, min_tokens=0, thinking_token_budget=None,
                             extra_args={GROUP_ARG: "g"})
    requests = {rid: SimpleNamespace(sampling_params=params, output_token_ids=answer[:3]) for rid in ("a", "b")}

    class SamplerStandIn:
        def forward(self, metadata, draft_probs, logits, sampling_metadata):
            return SimpleNamespace(sampled_token_ids=self.verdicts)

    runner = SimpleNamespace(input_batch=_batch([("s", [1, 2], answer)]), requests={"s": requests["a"]},
                             rejection_sampler=SamplerStandIn(), model=torch.nn.Linear(10, 10))
    drafter = GroupDrafter(_DrafterConfig(), runner=runner, read_here=True)
    drafter.propose([answer[-1:]])  # a sibling of the group decodes the whole answer, and leaves
    runner.input_batch, runner.requests = _batch([]), {}
    drafter.propose([])
    runner.input_batch, runner.requests = _batch([("a", [1, 2], answer[:3]), ("b", [1, 2], answer[:3])]), requests
    batch = runner.input_batch
    drafts = drafter.propose([answer[2:3]] * 2, batch.num_tokens_no_spec, batch.token_ids_cpu)
    while drafter.drafting.stats.steps % CHECK_EVERY:  # the step verified next is one the law check looks at
        drafter.drafting.stats.steps += 1
    assert drafts == [answer[3:7]] * 2
    assert runner.rejection_sampler.forward.__name__ == "forward" and drafter._watched is runner.rejection_sampler
    vocab = 100
    metadata = SpecDecodeMetadata.make_dummy(drafts, torch.device("cpu"))
    metadata.target_logits_indices = torch.arange(8, dtype=torch.int32)
    runner.rejection_sampler.verdicts = torch.tensor([answer[3:5] + [99, -1, -1], answer[3:8]])  # 2 kept, then 4
    sampling = SimpleNamespace(all_greedy=False, temperature=torch.ones(2), no_penalties=True,
                               allowed_token_ids_mask=None, bad_words_token_ids={})
    runner.rejection_sampler.forward(metadata, None, torch.zeros(10, vocab), sampling)
    assert drafter.drafting.stats.drafted == 0  # read at the next proposal, not before
    runner.input_batch = _batch([("a", [1, 2], answer[:3] + [52, 53, 99]), ("b", [1, 2], answer[:8])])
    drafter.propose([[99], answer[7:8]])
    s = drafter.drafting.stats
    assert (s.drafted, s.accepted) == (8, 6)
    cost = drafter.drafting.planner.cost  # a verified token priced by the model's 110 parameters; steps timed
    assert cost.token_s == pytest.approx(110 * VERIFY_S_PER_PARAM) and cost.steps_timed == 2 and cost.row_s > 0
    assert s.law.tested == 3 + 4 and s.law.accepted == 6 and s.law.expected == pytest.approx(7 / vocab)
