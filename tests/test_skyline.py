"""The memory-skyline plan under a KV budget: within budget by construction, followed step for step with exact
lengths, and shorter than admitting longest-first as soon as a sample fits (which runs long samples in lockstep)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_infsample.core import KVBudget, PagedKVBudget, TracePrompt
from verl_infsample.core import skyline
from verl_infsample.core.admission import SkylinePacedAdmission
from verl_infsample.core.skyline import plan_skyline
from verl_infsample.engines import simulate
from verl_infsample.engines.simulated import SimulatedEngine
from test_paged_kv_budget import TRACE

BUDGETS = [KVBudget(400), KVBudget(600, block_size=8), PagedKVBudget(24, 16), PagedKVBudget(40, 16, max_running=5)]


def _use_per_step(start, steps, prompt_lens, groups, memory) -> np.ndarray:
    """Step by step: each job its footprint from its start, each group its prompt while one of its jobs runs."""
    end = int(max(s + n for s, n in zip(start, steps)))
    use = np.zeros(end, dtype=np.int64)
    held = np.zeros((max(groups) + 1, end), dtype=bool)
    for s, n, p, g in zip(start, steps, prompt_lens, groups):
        use[s:s + n] += memory.footprint(p, n)
        held[g, s:s + n] = True
    for g in set(groups):
        use += held[g] * memory.prompt_footprint(prompt_lens[list(groups).index(g)])
    return use


@settings(max_examples=40, deadline=None)
@given(memory=st.sampled_from(BUDGETS), data=st.data())
def test_the_plan_never_exceeds_the_budget(memory, data):
    n_groups = data.draw(st.integers(1, 3))
    prompt_by_group = data.draw(st.lists(st.integers(1, 60), min_size=n_groups, max_size=n_groups))
    lengths = data.draw(st.lists(st.integers(1, 120), min_size=1, max_size=24))
    groups = [data.draw(st.integers(0, n_groups - 1)) for _ in lengths]
    prompt_lens = [prompt_by_group[g] for g in groups]
    plan = plan_skyline(np.array(lengths, float), np.array(prompt_lens), np.array(groups), memory)
    assert plan is not None
    use = _use_per_step(plan.start.tolist(), lengths, prompt_lens, groups, memory)
    assert use.max() <= memory.limit
    if memory.max_running is not None:
        running = np.zeros(len(use), dtype=int)
        for s, n in zip(plan.start.tolist(), lengths):
            running[s:s + n] += 1
        assert running.max() <= memory.max_running
    assert plan.makespan >= len(use)  # the plan's own figure is never optimistic


def _first_fit_by_brute_force(sky, footprint, prompt, group, not_before):
    """Every start from ``not_before`` on, each checked step by step: the definition ``earliest_fit`` prunes."""
    t = max(0, not_before)
    while True:
        span = range(t, t + len(footprint))
        if all((sky.use[i] if i < len(sky.use) else 0) + footprint[i - t]
               + (prompt if i >= sky.held.shape[1] or sky.held[group, i] == 0 else 0) <= sky.limit
               and (i >= len(sky.running) or sky.running[i] < sky.max_running) for i in span):
            return t
        t += 1


@settings(max_examples=60, deadline=None)
@given(data=st.data(), max_running=st.sampled_from([None, 2, 4]))
def test_earliest_fit_is_the_first_start_that_fits_and_place_undoes_exactly(data, max_running):
    limit = data.draw(st.integers(8, 30))  # tight: most placements have to wait for room
    sky = skyline.MemorySkyline(limit, horizon=8, groups=2, max_running=max_running)
    for _ in range(data.draw(st.integers(1, 20))):
        n = data.draw(st.integers(1, 30))
        footprint = np.sort(np.array(data.draw(st.lists(st.integers(1, 6), min_size=n, max_size=n))))
        prompt, group = data.draw(st.integers(0, 6)), data.draw(st.integers(0, 1))
        not_before = data.draw(st.integers(0, 20))
        if footprint[-1] + prompt > limit:
            continue
        before = (sky.use.copy(), sky.running.copy(), sky.held.copy(), sky.end)
        t = sky.earliest_fit(footprint, prompt, group, not_before)
        assert t == _first_fit_by_brute_force(sky, footprint, prompt, group, not_before)
        sky.place(footprint, prompt, group, t)
        assert sky.use.max() <= limit and (max_running is None or sky.running.max() <= max_running)
        if data.draw(st.booleans()):  # taking it out again restores the skyline exactly
            sky.place(footprint, prompt, group, t, sign=-1)
            assert sky.end == before[3]
            for now, then in zip((sky.use, sky.running, sky.held), before[:3]):
                kept = then.shape[-1]  # (the arrays may have grown: the new steps must be empty)
                assert not now[..., kept:].any() and (now[..., :kept] == then).all()


def test_exact_lengths_follow_the_plan_step_for_step_without_preemption():
    """vLLM's G=32 lengths in its 19 blocks of 32: every sample starts at its planned step (the gaps between planned
    starts are kept, not closed up), and nothing is preempted."""
    budget = PagedKVBudget(19, 32, max_running=32)

    class OneStepAtATime(SimulatedEngine):  # as a real engine: one step per loop, admission checked every step
        def step(self, sched):
            return [s for s in sched.running if s.generated + 1 >= s.true_len], 1

    from verl_infsample.core import Group, Scheduler, make_policy

    from verl_infsample.predict import make_predictor
    from verl_infsample.engines.base import run_rollout

    groups = [Group(p.prompt_id, p.prompt_len, p.group_size) for p in TRACE]
    policy = make_policy("oracle")
    sched = Scheduler(groups, policy, budget, make_predictor("oracle", max_len=96), 96,
                      true_lengths=[list(p.lengths) for p in TRACE])
    plan = dict(policy.admission.planned_start)
    run_rollout(OneStepAtATime(), sched)
    assert sched.stats.preemptions == 0
    assert {s.uid: s.admitted_at for s in sched.samples} == plan
    assert sched.stats.decode_steps == policy.plan_info["planned_steps"]


@pytest.mark.parametrize("blocks", [19, 39])
def test_staggering_beats_admitting_whatever_fits(monkeypatch, blocks):
    """Longest-first admission as soon as a sample fits starts the 96-token answers together, so their peaks
    coincide; the skyline staggers them. Same budget, same exact lengths, both without a preemption. (In 39 blocks
    vLLM's max_num_seqs=32 binds too: the plan counts running samples.) vLLM measured 445 / 229 steps against 549 /
    284 before, and plain submission 448 / 235 with 62 / 45 preemptions."""
    budget = PagedKVBudget(blocks, 32, max_running=32)
    planned = simulate(TRACE, "oracle", budget, "oracle", max_len=96)
    monkeypatch.setattr(skyline, "MAX_CELLS", 0)  # the plan for batches too big for the skyline
    greedy = simulate(TRACE, "oracle", budget, "oracle", max_len=96)
    assert planned.plan["plan_method"] == "skyline" and greedy.plan["plan_method"] == "group-major"
    assert planned.preemptions == greedy.preemptions == 0
    assert planned.decode_steps <= 0.85 * greedy.decode_steps, (planned.decode_steps, greedy.decode_steps)


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_backfilled_samples_leave_the_plan_and_the_gates_hold(seed):
    """Short answers (1-5 tokens) that end before the next planned start go early (backfill). The plan then no
    longer counts them at their planned steps, so the samples running on plan still match it and later starts keep
    their gaps: with exact lengths the run ends at the planned step. (Counted in the plan, a backfilled sample made
    the run look off plan and admit whatever fit: 553 / 599 / 502 steps against 496 / 532 / 438 planned.)"""
    rng = np.random.default_rng(seed)
    trace = []
    for g in range(3):
        lengths = np.where(rng.random(24) < 0.3, rng.integers(1, 6, 24),
                           np.where(rng.random(24) < 0.75, rng.integers(10, 60, 24), 128))
        trace.append(TracePrompt(f"p{g}", int(rng.integers(8, 20)), tuple(int(n) for n in lengths)))
    res, sched = simulate(trace, "oracle", KVBudget(400, block_size=16), "oracle", max_len=128,
                          return_scheduler=True)
    planned = sched.policy.admission.planned_start
    early = [s for s in sched.samples if s.admitted_at < planned[s.uid]]
    assert early and all(s.true_len <= 5 for s in early)  # backfill happened, of short answers only
    assert all(s.admitted_at == planned[s.uid] for s in sched.samples if s not in early)
    assert res.preemptions == 0 and res.decode_steps == res.plan["planned_steps"]


def test_ruin_and_recreate_shortens_the_plan(monkeypatch):
    """vLLM's G=32 lengths in 19 blocks: the best pacing alone leaves dips between the staggered long answers
    (449 steps); the improvement moves fill them, below plain submission's 448 steps on vLLM, and the same input
    gives the same plan (seeded)."""
    lengths = np.array([n for p in TRACE for n in p.lengths], float)
    prompt_lens = np.array([p.prompt_len for p in TRACE for _ in p.lengths])
    groups = np.array([g for g, p in enumerate(TRACE) for _ in p.lengths])
    budget = PagedKVBudget(19, 32, max_running=32)
    improved = plan_skyline(lengths, prompt_lens, groups, budget)
    again = plan_skyline(lengths, prompt_lens, groups, budget)
    monkeypatch.setattr(skyline, "IMPROVE_MOVES", 0)
    paced = plan_skyline(lengths, prompt_lens, groups, budget)
    assert improved.makespan < paced.makespan and improved.makespan < 448, (improved.makespan, paced.makespan)
    assert np.array_equal(improved.start, again.start)
    use = _use_per_step(improved.start.tolist(), lengths.astype(int).tolist(), prompt_lens.tolist(), groups.tolist(),
                        budget)
    assert use.max() <= budget.limit


@pytest.mark.parametrize("dist", ["lognormal", "bimodal"])
def test_token_budgets_plan_in_ticks_and_stay_within_budget(dist):
    """Long answers are planned in ticks of several steps (each charged its most); still no preemption with exact
    lengths, and no more steps than the longest-first greedy."""
    from verl_infsample.core import synth_trace

    trace = synth_trace(prompts=1, group_size=32, max_len=1024, dist=dist, seed=1)
    budget = KVBudget(4000)
    res = simulate(trace, "oracle", budget, "oracle", max_len=1024)
    assert res.plan["plan_method"] == "skyline" and res.preemptions == 0
    assert res.peak_kv_tokens <= budget.tokens
    assert res.plan["planned_steps"] % math.ceil(np.mean([n for p in trace for n in p.lengths]) / 64) == 0
    old = skyline.MAX_CELLS
    try:
        skyline.MAX_CELLS = 0
        greedy = simulate(trace, "oracle", budget, "oracle", max_len=1024)
    finally:
        skyline.MAX_CELLS = old
    assert res.decode_steps <= greedy.decode_steps


def test_a_big_batch_is_planned_in_coarser_ticks_before_giving_up(monkeypatch):
    """Past MAX_CELLS at the usual resolution, the plan is made in coarser ticks (still within budget, still no
    preemption with exact lengths); only past it at MIN_TICKS_PER_SAMPLE does the policy fall back to group-major."""
    from verl_infsample.core import synth_trace

    trace = synth_trace(prompts=2, group_size=32, max_len=1024, dist="lognormal", seed=1)
    budget = KVBudget(4000)
    lengths = np.array([n for p in trace for n in p.lengths])
    fine = math.ceil(lengths.mean() / skyline.TICKS_PER_SAMPLE)
    normal = simulate(trace, "oracle", budget, "oracle", max_len=1024)
    assert normal.plan["planned_steps"] % fine == 0
    monkeypatch.setattr(skyline, "MAX_CELLS", 66 * math.ceil(normal.plan["planned_steps"] / fine) // 2)
    coarse, sched = simulate(trace, "oracle", budget, "oracle", max_len=1024, return_scheduler=True)
    assert coarse.plan["plan_method"] == "skyline" and coarse.preemptions == 0
    assert coarse.peak_kv_tokens <= budget.tokens
    starts = sched.policy.admission.planned_start.values()
    assert math.gcd(coarse.plan["planned_steps"], *starts) > fine  # starts on coarser ticks
    monkeypatch.setattr(skyline, "MIN_TICKS_PER_SAMPLE", skyline.TICKS_PER_SAMPLE)  # no coarser ticks allowed
    assert simulate(trace, "oracle", budget, "oracle", max_len=1024).plan["plan_method"] == "group-major"


def test_too_big_for_the_skyline_falls_back_to_group_major():
    trace = [TracePrompt(str(i), 20, tuple([50] * 64)) for i in range(64)]
    res = simulate(trace, "infinite", KVBudget(3000), "oracle", max_len=64)
    assert res.plan["plan_method"] == "group-major" and res.samples == 64 * 64


def test_a_backfilled_sample_stays_off_plan_when_preempted_and_readmitted(monkeypatch):
    """Under wrong predictions a backfilled sample can be preempted and come back. It left the plan once and stays
    off it: its planned interval is taken out of the plan's count exactly once, and it is never counted among the
    samples running on plan. (Before, re-admission by backfill took its interval out a second time, and re-admission
    as the queue's head counted it on plan although the plan no longer had it.)"""
    rng = np.random.default_rng(5)
    trace = [TracePrompt(f"p{g}", int(rng.integers(8, 20)),
                         tuple(int(n) for n in np.where(rng.random(24) < 0.3, rng.integers(1, 6, 24),
                                                        rng.integers(10, 128, 24))))
             for g in range(3)]
    left: list[int] = []
    leave = SkylinePacedAdmission._leave_plan
    monkeypatch.setattr(SkylinePacedAdmission, "_leave_plan", lambda pol, s: (left.append(s.uid), leave(pol, s)))
    preempted_off_plan = 0

    def check(sched):
        nonlocal preempted_off_plan
        pol = sched.policy.admission
        preempted_off_plan += sum(1 for s in sched.samples if s.uid in pol._backfilled and s.preemptions
                                  and s.state.value == "waiting")
        expected = np.zeros_like(pol._planned_running)
        for s in sched.samples:
            if s.uid not in left:
                expected[pol.planned_start[s.uid]:pol._planned_end[s.uid]] += 1
        assert np.array_equal(pol._planned_running, expected)
        assert pol._in_flight == sum(1 for s in sched.running if s.uid not in pol._backfilled)

    res = simulate(trace, "infinite", KVBudget(400, block_size=16), "noisy:0.8", max_len=128, seed=2,
                   on_step=check)
    assert res.plan["plan_method"] == "skyline" and res.preemptions > 0
    assert preempted_off_plan > 0, "the case under test: a backfilled sample preempted and waiting to come back"
    assert len(left) == len(set(left))
