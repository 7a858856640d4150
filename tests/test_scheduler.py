"""Every policy, on every capacity model, returns every sample exactly once, and respects its capacity."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from verl_infsample.core import KVBudget, SlotPool, TracePrompt
from verl_infsample.core.predictor import LengthPredictor

from verl_infsample.predict import make_predictor
from verl_infsample.core.policies import POLICIES
from verl_infsample.core.sample import SampleState
from verl_infsample.engines import simulate


@st.composite
def traces(draw):
    n_prompts = draw(st.integers(1, 5))
    out = []
    for p in range(n_prompts):
        g = draw(st.integers(1, 12))
        lengths = draw(st.lists(st.integers(1, 60), min_size=g, max_size=g))
        out.append(TracePrompt(f"p{p}", draw(st.integers(0, 30)), tuple(lengths)))
    return out


def _check_complete(trace, sched):
    groups = sched.results()
    assert [len(g) for g in groups] == [p.group_size for p in trace]
    for p, group in zip(trace, groups):
        assert [s.index for s in group] == list(range(p.group_size))
        assert all(s.state is SampleState.FINISHED for s in group)
        assert [s.generated for s in group] == list(p.lengths)  # every token decoded, none twice
    uids = [s.uid for g in groups for s in g]
    assert len(uids) == len(set(uids)) == sum(p.group_size for p in trace)


@settings(max_examples=60, deadline=None)
@given(trace=traces(), slots=st.integers(1, 10), policy=st.sampled_from(sorted(POLICIES)),
       predictor=st.sampled_from(["oracle", "noisy:0.5", "none", "history"]))
def test_every_sample_exactly_once_under_slots(trace, slots, policy, predictor):
    res, sched = simulate(trace, policy, SlotPool(slots), predictor, return_scheduler=True)
    _check_complete(trace, sched)
    total = sum(sum(p.lengths) for p in trace)
    assert res.total_tokens == total
    longest = max(max(p.lengths) for p in trace)
    if policy != "full":
        assert res.peak_active <= slots
        assert res.decode_steps >= max(longest, -(-total // slots))  # nobody beats the lower bound
    assert res.preemptions == 0


# A budget of one prompt plus one response of the cap, where a skyline plan once left the engine idle waiting for a
# planned start and the scheduler refused to go on.
TIGHT_BUDGET_CASE = [TracePrompt("p0", 15, (6, 21, 16, 31, 46, 47, 54)), TracePrompt("p1", 15, (21, 35, 54, 21))]


@settings(max_examples=60, deadline=None)
@given(trace=traces(), extra=st.one_of(st.just(0), st.integers(0, 400)), policy=st.sampled_from(sorted(POLICIES)),
       predictor=st.sampled_from(["oracle", "noisy:0.5", "none", "history", "learned"]))
@example(trace=TIGHT_BUDGET_CASE, extra=0, policy="infinite", predictor="oracle")
def test_every_sample_exactly_once_under_kv_budget(trace, extra, policy, predictor):
    max_len = 60
    budget = max(p.prompt_len for p in trace) + max_len + extra
    res, sched = simulate(trace, policy, KVBudget(budget), predictor, max_len=max_len, return_scheduler=True)
    _check_complete(trace, sched)
    if policy != "full":
        assert res.peak_kv_tokens <= budget  # preemption keeps reality inside the budget
    exact = predictor in ("oracle", "none")  # the true lengths, or the cap: never less than a sample needs
    if policy not in ("full", "plain") and (exact or policy in ("naive", "continuous")):
        assert res.preemptions == 0  # exact or worst-case reservations never overflow


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("predictor", ["oracle", "noisy:0.5", "none", "history", "learned"])
def test_a_budget_of_one_sample_never_stalls(policy, predictor):
    """The smallest budget the scheduler accepts (one prompt plus one response of the cap) runs to the end under
    every policy and predictor: whenever the engine is empty, some sample starts."""
    res, sched = simulate(TIGHT_BUDGET_CASE, policy, KVBudget(15 + 60), predictor, max_len=60, return_scheduler=True)
    _check_complete(TIGHT_BUDGET_CASE, sched)
    if policy != "full":
        assert res.peak_kv_tokens <= 75


def test_an_idle_engine_starts_the_planned_head_at_once():
    """The skyline plan of the tight case has a gap with nothing running; the scheduler starts the next planned
    sample at once instead of idling through it, so no step passes with nothing decoding."""
    res, sched = simulate(TIGHT_BUDGET_CASE, "infinite", KVBudget(75), "oracle", max_len=60, return_scheduler=True)
    busy = sorted((s.admitted_at, s.finished_at) for g in sched.results() for s in g)
    covered = 0
    for start, end in busy:
        assert start <= covered, f"nothing ran from step {covered} to {start}"
        covered = max(covered, end)
    assert covered == res.decode_steps


def test_underpredicted_lengths_preempt_and_the_cost_is_counted():
    trace = [TracePrompt("a", 10, (50, 50, 50, 50)), TracePrompt("b", 10, (40, 45, 50, 55))]

    class Underpredict(LengthPredictor):  # a predictor that believes every sample is 5 tokens long
        name = "under"

        def predict(self, group, sample):
            return 5.0

        def observe(self, group, sample, length):
            pass

    res, sched = simulate(trace, "infinite", KVBudget(120), Underpredict(), max_len=60, return_scheduler=True)
    _check_complete(trace, sched)
    assert res.preemptions > 0
    assert res.recompute_tokens > 0
    assert res.peak_kv_tokens <= 120
    assert sum(s.preemptions for s in sched.samples) == res.preemptions


def test_naive_runs_rounds_of_one_group_that_wait_for_the_longest():
    trace = [TracePrompt("a", 5, (10, 3, 7, 2, 9)), TracePrompt("b", 5, (4, 4, 4))]
    res, sched = simulate(trace, "naive", SlotPool(2), "none", return_scheduler=True)
    rounds: dict[int, list] = {}
    for s in sched.samples:
        rounds.setdefault(s.admitted_at, []).append(s)
    previous_end = 0
    for start in sorted(rounds):
        members = rounds[start]
        assert len(members) <= 2 and len({s.group for s in members}) == 1
        assert start == previous_end  # the next round starts exactly when the last one's longest sample ends
        previous_end = max(s.finished_at for s in members)
    assert res.decode_steps == 10 + 7 + 9 + 4 + 4


def test_full_decodes_each_group_at_once():
    trace = [TracePrompt("a", 5, (10, 3, 7)), TracePrompt("b", 5, (4, 6))]
    res = simulate(trace, "full", SlotPool(1), "none")
    assert res.decode_steps == 10 + 6
    assert res.peak_active == 3


def test_continuous_refills_a_freed_slot_at_once():
    trace = [TracePrompt("a", 0, (10, 2, 3, 4))]
    _, sched = simulate(trace, "continuous", SlotPool(2), "none", return_scheduler=True)
    by_index = {s.index: s for s in sched.samples}
    assert by_index[2].admitted_at == by_index[1].finished_at == 2
    assert by_index[3].admitted_at == by_index[2].finished_at == 5


def test_partial_results_are_refused_and_impossible_budgets_rejected():
    trace = [TracePrompt("a", 100, (10, 20))]
    with pytest.raises(ValueError, match=r"kv_budget=50 tokens cannot hold one sample.*needs 120"):
        simulate(trace, "infinite", KVBudget(50), "oracle")
    with pytest.raises(ValueError, match="slots"):
        SlotPool(0)
    with pytest.raises(ValueError, match="unknown policy 'fastest'"):
        simulate(trace, "fastest", SlotPool(2), "oracle")
    with pytest.raises(ValueError, match="unknown predictor"):
        simulate(trace, "infinite", SlotPool(2), "psychic")
    with pytest.raises(ValueError, match="SIGMA"):
        simulate(trace, "infinite", SlotPool(2), "noisy:lots")
    from verl_infsample.core import Group, Scheduler, make_policy
    from verl_infsample.predict import make_predictor

    sched = Scheduler([Group("a", 1, 2)], make_policy("continuous"), SlotPool(1),
                      make_predictor("none", max_len=5), max_len=5)
    with pytest.raises(RuntimeError, match="partial groups"):
        sched.results()


def test_history_predictor_learns_per_prompt_then_global():
    from verl_infsample.core import Group, Sample

    pred = make_predictor("history", max_len=1000)
    g_a, g_b = Group("a", 1, 2), Group("b", 1, 2)
    s = Sample(uid=0, group=0, index=0, prompt_len=1)
    assert pred.predict(g_a, s) == 1000  # nothing seen: worst case
    pred.observe(g_a, s, 100)
    pred.observe(g_a, s, 300)
    assert pred.predict(g_a, s) == 200
    assert pred.predict(g_b, s) == 200  # unseen prompt: global mean
    pred.observe(g_b, s, 500)
    assert pred.predict(g_b, s) == 500
    assert pred.predict(Group("c", 1, 1), s) == pytest.approx(300)


def test_history_predicts_an_outgrown_sample_from_complete_earlier_rollouts():
    """Past its prediction, a sample is predicted the mean of earlier lengths beyond what it has generated (its
    prompt's, else all prompts'), from complete rollouts only: the first to finish are the short ones."""
    from verl_infsample.core import Group, Sample

    pred = make_predictor("history", max_len=1000)
    g_a, g_b = Group("a", 1, 4), Group("b", 1, 1)
    s = Sample(uid=0, group=0, index=0, prompt_len=1, generated=50)
    for n in (10, 20, 100, 200):
        pred.observe(g_a, s, n)
    assert pred.predict_outgrown(g_a, s) == 1000  # the rollout in progress does not count yet
    pred.start_batch([g_a, g_b])
    assert pred.predict_outgrown(g_a, s) == 150  # (100 + 200) / 2
    assert pred.predict_outgrown(g_b, s) == 150  # unseen prompt: all prompts' lengths
    s.generated = 200
    assert pred.predict_outgrown(g_a, s) == 1000  # longer than anything seen: the worst case
    pred.observe(g_b, s, 700)
    pred.start_batch([g_b])
    assert pred.predict_outgrown(g_a, s) == 700 and pred.predict_outgrown(g_b, s) == 700


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 300)), max_size=40), min_size=1, max_size=4),
       st.lists(st.integers(0, 320), min_size=1, max_size=8))
def test_history_outgrown_is_the_mean_of_the_kept_lengths_beyond(batches, generated):
    """``predict_outgrown`` (sorted pools and suffix sums, rebuilt when the pools change) equals the plain mean of
    the kept lengths beyond what a sample has, batch after batch, and after ``load_state``."""
    from verl_infsample.core import Group, Sample

    pred = make_predictor("history", max_len=1000)
    groups = {g: Group(g, 1, 1) for g in "abcd"}

    def brute(g, n):
        for kept in (list(pred._lengths.get(g, ())), list(pred._all_lengths)):
            longer = [x for x in kept if x > n]
            if longer:
                return sum(longer) / len(longer)
        return 1000.0

    for batch in batches:
        for g, n in batch:
            pred.observe(groups[g], None, n)
        pred.start_batch(list(groups.values()))
        for g in groups:
            for n in generated:
                s = Sample(uid=0, group=0, index=0, prompt_len=1, generated=n)
                assert pred.predict_outgrown(groups[g], s) == brute(g, n)
    copy = make_predictor("history", max_len=1000)
    copy.predict_outgrown(groups["a"], Sample(uid=0, group=0, index=0, prompt_len=1, generated=0))  # (cached: none)
    copy.load_state(pred.state())
    for g in groups:
        s = Sample(uid=0, group=0, index=0, prompt_len=1, generated=generated[0])
        assert copy.predict_outgrown(groups[g], s) == brute(g, generated[0])


def test_outgrown_predictions_count_as_the_predictors_time():
    """Re-predicting samples that outgrew their prediction (every step under a KV budget) is the predictor's work:
    it is in ``refine_ms``."""
    import time

    class SlowOutgrownHistory(type(make_predictor("history", max_len=100))):
        calls = 0

        def predict_outgrown(self, group, sample):
            SlowOutgrownHistory.calls += 1
            time.sleep(0.002)
            return super().predict_outgrown(group, sample)

    trace = [TracePrompt("p0", 8, (5, 40, 60, 90)), TracePrompt("p1", 8, (10, 70, 80, 100))]
    pred = SlowOutgrownHistory(100)
    simulate(trace, "infinite", KVBudget(400), pred, max_len=100)  # an earlier epoch: predictions of ~57
    SlowOutgrownHistory.calls = 0
    _, sched = simulate(trace, "infinite", KVBudget(400), pred, max_len=100, return_scheduler=True)
    assert SlowOutgrownHistory.calls > 0
    assert sched.stats.refine_ms >= 0.9 * 2.0 * SlowOutgrownHistory.calls


def test_history_keeps_the_spread_of_a_big_rollout():
    from verl_infsample.core import Group, Sample

    pred = make_predictor("history", max_len=5000)
    g = Group("a", 1, 4000)
    lengths = np.random.default_rng(0).geometric(1 / 300, 4000)
    for n in lengths:
        pred.observe(g, Sample(uid=0, group=0, index=0, prompt_len=1), int(n))
    pred.start_batch([g])
    for generated in (0, 300, 900):
        s = Sample(uid=0, group=0, index=0, prompt_len=1, generated=generated)
        true = lengths[lengths > generated].mean()
        assert pred.predict_outgrown(g, s) == pytest.approx(true, rel=0.05)  # 256 kept of 4000: same spread


def test_outgrown_predictions_avoid_preemptions_under_a_kv_budget(monkeypatch):
    """Memoryless (geometric) lengths, as from a random-weights model: a sample that outlives the mean is as far from
    its end as a fresh one. Projected to end at the next step, it lets admission overcommit; predicted from the
    earlier lengths beyond it, it does not."""
    from verl_infsample.core import Scheduler

    def trace(seed):
        rng = np.random.default_rng(seed)
        return [TracePrompt(f"p{g}", 64, tuple(int(n) for n in np.minimum(256, rng.geometric(3 / 256, 128))))
                for g in range(2)]

    budget = KVBudget(16 * (64 + 256), block_size=16, max_running=64)

    def run():
        pred = make_predictor("history", max_len=256)
        simulate(trace(1), "infinite", budget, pred, max_len=256)  # the previous epoch
        return simulate(trace(0), "infinite", budget, pred, max_len=256)

    repredicted = run()
    monkeypatch.setattr(Scheduler, "_predict_outgrown", lambda self: None)
    ends_next_step = run()
    assert repredicted.preemptions <= ends_next_step.preemptions / 2
    assert repredicted.decode_steps <= ends_next_step.decode_steps


@pytest.mark.parametrize("predictor", ["history", "learned:k=8,min=8"])
def test_every_outgrown_sample_is_repredicted_before_admission(predictor):
    """The scheduler does not scan the running set each step for samples past their prediction: it notes when each
    will reach it (on admission and at each new prediction). Whenever the budget projects the running set to admit
    a sample, none that ran a step is left past it, however predictions moved meanwhile (token reports,
    preemptions and readmissions)."""

    class CheckingKVBudget(KVBudget):
        """The real budget, asserting on what it reads before each admission."""

        checks: list[int] = []

        def admits(self, sample, ledger) -> bool:  # (samples admitted this round are re-predicted at the next)
            assert all(s.generated < s.predicted_len for s in ledger.running
                       if s.admitted_at < ledger.stats.decode_steps)
            CheckingKVBudget.checks.append(len(ledger.running))
            return super().admits(sample, ledger)

    rng = np.random.default_rng(0)
    trace = [TracePrompt(f"p{g}", 16, tuple(int(n) for n in np.minimum(128, rng.geometric(3 / 128, 24))),
                         tokens=tuple(tuple(int(t) for t in rng.integers(0, 50, 128)) for _ in range(24)))
             for g in range(4)]
    pred = make_predictor(predictor, max_len=128)
    simulate(trace, "infinite", KVBudget(900), pred, max_len=128)  # an earlier epoch: predictions to outgrow
    result = simulate(trace, "infinite", CheckingKVBudget(900), pred, max_len=128)
    assert result.preemptions > 0 and len(CheckingKVBudget.checks) > 50 and max(CheckingKVBudget.checks) > 4


def test_noisy_predictions_do_not_depend_on_the_policy():
    trace = [TracePrompt(f"p{i}", 5, tuple(range(10 + i, 30 + i))) for i in range(3)]
    _, a = simulate(trace, "lpt", SlotPool(4), "noisy:0.3", seed=7, return_scheduler=True)
    _, b = simulate(trace, "infinite", SlotPool(2), "noisy:0.3", seed=7, return_scheduler=True)
    assert [s.predicted_len for s in a.samples] == [s.predicted_len for s in b.samples]
    _, c = simulate(trace, "infinite", SlotPool(2), "noisy:0.3", seed=8, return_scheduler=True)
    assert [s.predicted_len for s in a.samples] != [s.predicted_len for s in c.samples]
    ratios = np.array([s.predicted_len / s.true_len for s in a.samples])
    assert 0.1 < np.std(np.log(ratios)) < 0.6


def test_slot_plan_interleaves_groups_within_a_chunk_and_keeps_chunks_apart():
    """Under M slots ``infinite`` plans chunks of groups with the FPTAS: within a chunk the long samples of every
    group go first (the short ones are kept for the tail, where lanes must end together); a chunk holds as many
    groups as keep their prompts within OPEN_PROMPT_SHARE of the lanes' KV, so a batch of long prompts is planned
    group after group and the open prompts stay bounded."""
    from verl_infsample.core.policies import OPEN_PROMPT_SHARE, chunk_groups

    assert chunk_groups([3, 1, 2, 0], [10, 10, 10, 10], 25) == [[3, 1], [2, 0]]
    assert chunk_groups([0, 1], [50, 5], 25) == [[0], [1]]  # a prompt over the allowance still gets its chunk
    lengths = [[100, 100, 5, 5, 5, 5], [90, 90, 5, 5, 5, 5]]
    trace = [TracePrompt(f"p{g}", 8, tuple(ls)) for g, ls in enumerate(lengths)]
    res, sched = simulate(trace, "oracle", SlotPool(2), max_len=100, return_scheduler=True)
    starts = {s.key: s.admitted_at for s in sched.samples}
    assert res.plan["plan_chunks"] == 1
    assert max(starts[(g, i)] for g in (0, 1) for i in (0, 1)) < min(starts[(g, i)] for g in (0, 1)
                                                                       for i in range(2, 6))  # all long ones first
    assert res.decode_steps == res.lower_bound_steps
    # prompts as long as the lanes hold: one group per chunk, and the first group ends before the second starts
    long_prompts = [TracePrompt(f"p{g}", int(2 * 100 * OPEN_PROMPT_SHARE) + 1, tuple(ls))
                    for g, ls in enumerate(lengths)]
    res, sched = simulate(long_prompts, "oracle", SlotPool(2), max_len=100, return_scheduler=True)
    assert res.plan["plan_chunks"] == 2
    first, second = sched.samples[:6], sched.samples[6:]
    assert max(s.admitted_at for s in first) <= min(s.admitted_at for s in second)


def test_the_plan_counts_as_the_rollouts_scheduling_time(monkeypatch):
    """The plan is made when the scheduler is built, before the decode loop; the rollout's scheduler time (what
    ``bench-engine`` reports as ``sched_overhead``) includes it; ``step_overhead`` leaves it out. A plan made 200 ms
    slower shows in the one and not in the other."""
    import time

    from verl_infsample.core import build_scheduler, synth_trace
    from verl_infsample.core.policies import InfiniteSamplingPolicy
    from verl_infsample.core.sample import Group
    from verl_infsample.engines.base import run_rollout
    from verl_infsample.engines.simulated import SimulatedEngine

    trace = synth_trace(4, 16, 256, "lognormal", seed=3)

    def rollout():
        sched = build_scheduler([Group(p.prompt_id, p.prompt_len, p.group_size) for p in trace], "oracle",
                                KVBudget(3000), None, 256, true_lengths=[list(p.lengths) for p in trace])
        assert sched.policy.plan_info["plan_method"] == "skyline"
        return run_rollout(SimulatedEngine(), sched)

    real_plan = InfiniteSamplingPolicy.plan

    def slow_plan(self, *args, **kwargs):
        time.sleep(0.2)
        return real_plan(self, *args, **kwargs)

    monkeypatch.setattr(InfiniteSamplingPolicy, "plan", slow_plan)
    timing = rollout()
    assert timing.plan_s >= 0.2 and timing.scheduler_s >= timing.plan_s  # the plan is scheduling time ...
    # ... and not the loop's: the per-step overhead (bench-engine's step_overhead) is its bookkeeping alone
    assert timing.step_overhead * timing.engine_s < 0.2


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.one_of(st.integers(1, 200).map(float),
                                                          st.floats(1.0, 200.0, allow_nan=False))),
                min_size=1, max_size=90),
       st.sampled_from([2, 3, 16, 32]))
def test_held_in_blocks_equals_every_sample_at_every_time(members, block):
    """The projection's whole-block sum (by prefix counts above ``_DIRECT_UP_TO`` samples) equals the plain sum over
    every sample at every candidate time (ties, fractional predictions, residues at block edges)."""
    from verl_infsample.core.capacity import whole_blocks
    from verl_infsample.core.capacity import held_in_blocks

    gen = np.array([g for g, _ in members], dtype=float)
    rem = np.array([t for _, t in members])
    order = np.argsort(-rem, kind="stable")
    at, g = rem[order], gen[order]
    plain = [sum(whole_blocks(g[i] + at[j], block) for i in range(len(at)) if at[i] >= at[j]) for j in range(len(at))]
    np.testing.assert_array_equal(held_in_blocks(g, at, block), plain)


_MEMBER = st.tuples(st.integers(0, 300), st.one_of(st.integers(1, 200).map(float), st.floats(1.0, 200.0)),
                    st.integers(0, 3))


@settings(max_examples=300, deadline=None)
@given(members=st.lists(_MEMBER, max_size=60), block=st.sampled_from([1, 3, 16]),
       prompts=st.lists(st.integers(0, 40), min_size=4, max_size=4), ahead=st.integers(0, 5))
def test_the_kv_projection_is_the_step_by_step_peak(members, block, prompts, ahead):
    """``KVBudget``'s projected peak and next-step use equal a step-by-step count: each sample holds
    whole_blocks(generated + t + 1) while it runs (t = 0 the next step, up to its predicted end), each group its
    prompt's whole blocks while one of its samples runs (ties, fractional predictions, block edges, empty sets, and
    past ``_DIRECT_UP_TO`` samples)."""
    import math

    from verl_infsample.core.capacity import whole_blocks
    from verl_infsample.core.sample import Sample

    running = [Sample(uid=i, group=grp, index=i, prompt_len=prompts[grp], predicted_len=gen + rem, generated=gen,
                      state=SampleState.RUNNING) for i, (gen, rem, grp) in enumerate(members)]
    steps = [math.ceil(s.remaining_predicted() - 1e-9) for s in running]

    def use_at(t):
        live = [s for s, n in zip(running, steps) if t < n]
        return (sum(whole_blocks(s.generated + t + 1, block) for s in live)
                + sum(whole_blocks(p, block) for p in {s.group: s.prompt_len for s in live}.values()))

    budget = KVBudget(10**6, block_size=block)
    assert budget.projected_peak(running) == max((use_at(t) for t in range(max(steps, default=0))), default=0)
    now = sum(whole_blocks(s.generated + ahead + 1, block) for s in running)
    assert budget.in_use(running, ahead) == now + sum(whole_blocks(p, block) for p in
                                                      {s.group: s.prompt_len for s in running}.values())


def test_held_in_blocks_for_a_few_hundred_running_samples():
    """The prefix-count path (past ``_DIRECT_UP_TO``) on hundreds of samples, with many ties and whole/half steps."""
    from verl_infsample.core.capacity import whole_blocks
    from verl_infsample.core.capacity import _DIRECT_UP_TO, held_in_blocks

    rng = np.random.default_rng(7)
    for m, block in [(_DIRECT_UP_TO + 1, 16), (300, 16), (257, 5)]:
        gen = rng.integers(0, 400, m).astype(float)
        at = np.sort(rng.integers(2, 80, m) / rng.choice([1, 2], m))[::-1]
        plain = (whole_blocks(gen[:, None] + at[None, :], block) * (at[:, None] >= at[None, :])).sum(axis=0)
        np.testing.assert_array_equal(held_in_blocks(gen, at, block), plain)


def test_an_admission_round_reads_the_running_set_once(monkeypatch):
    """Under a KV budget every candidate is checked against the running set's projected peak; the running set is
    turned into arrays once per admission round (then extended by what it admits), not once per candidate."""
    from verl_infsample.core import Scheduler
    from verl_infsample.core.capacity import SampleArrays

    builds, checks, per_round = [0], [0], []
    real_of, real_peak, real_admit = SampleArrays.of.__func__, KVBudget.projected_peak, Scheduler.admit

    def of(cls, samples):
        builds[0] += 1
        return real_of(cls, samples)

    def peak(self, running):
        checks[0] += 1
        return real_peak(self, running)

    def admit(self):
        before = builds[0]
        out = real_admit(self)
        per_round.append(builds[0] - before)
        return out

    monkeypatch.setattr(SampleArrays, "of", classmethod(of))
    monkeypatch.setattr(KVBudget, "projected_peak", peak)
    monkeypatch.setattr(Scheduler, "admit", admit)
    trace = [TracePrompt(f"p{g}", 20, tuple(int(n) for n in np.random.default_rng(g).integers(5, 120, 64)))
             for g in range(4)]
    res = simulate(trace, "infinite", KVBudget(3000, block_size=16), "noisy:0.3", max_len=120)
    assert res.peak_kv_tokens <= 3000 and checks[0] > 2 * len(per_round)  # several candidates per round
    assert max(per_round) == 1
