"""PagedKVBudget: admission in the blocks a paged, prefix-caching engine (vLLM) allocates, exactly."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_infsample.core import PagedKVBudget, TracePrompt
from verl_infsample.core.sample import Group, Sample
from verl_infsample.engines import simulate

# lengths vLLM sampled for 2 prompts (14 and 11 tokens) x G=32 in tests/vllm_env/vllm_cases.py's setting
LENGTHS = [[33, 47, 46, 11, 23, 96, 11, 80, 96, 69, 96, 29, 96, 19, 69, 27, 34, 96, 50, 96, 96, 96, 7, 72, 96, 73,
            96, 3, 96, 96, 86, 3],
           [96, 4, 40, 23, 61, 38, 96, 42, 4, 92, 96, 78, 96, 11, 4, 96, 96, 6, 96, 4, 65, 92, 4, 96, 4, 4, 96, 15,
            36, 13, 96, 96]]
TRACE = [TracePrompt("0", 14, tuple(LENGTHS[0])), TracePrompt("1", 11, tuple(LENGTHS[1]))]


def _blocks_by_brute_force(budget: PagedKVBudget, members: list[Sample]) -> int:
    """Step by step: each sample holds ceil((tail + generated + t) / B) blocks while it runs, each group its shared
    prompt blocks while one of its samples runs."""
    steps = [math.ceil(s.remaining_predicted() - 1e-9) for s in members]
    peak = 0
    for t in range(max(steps)):
        live = [s for s, n in zip(members, steps) if t < n]
        own = sum(math.ceil((budget.tail(s.prompt_len) + s.generated + t) / budget.block_size) for s in live)
        shared = {s.group: budget.shared_blocks(s.prompt_len) for s in live}
        peak = max(peak, own + sum(shared.values()))
    return peak


@settings(max_examples=80, deadline=None)
@given(block=st.sampled_from([1, 4, 16]), prompts=st.lists(st.integers(1, 70), min_size=1, max_size=3),
       data=st.data())
def test_projected_peak_is_the_step_by_step_peak(block, prompts, data):
    budget = PagedKVBudget(10_000, block)
    members = []
    for g, p in enumerate(prompts):
        for i in range(data.draw(st.integers(1, 5))):
            s = Sample(uid=len(members), group=g, index=i, prompt_len=p)
            s.generated = data.draw(st.integers(0, 40))
            s.predicted_len = s.generated + data.draw(st.floats(0.0, 50.0))
            members.append(s)
    assert budget.projected_peak(members) == _blocks_by_brute_force(budget, members)


def test_shared_prompt_blocks_and_the_recomputed_last_block():
    budget = PagedKVBudget(100, 32)
    # 64 tokens: vLLM hits at most 63 in the cache, so the second full block is each sample's own copy
    assert (budget.shared_blocks(64), budget.tail(64)) == (1, 32)
    assert (budget.shared_blocks(65), budget.tail(65)) == (2, 1)
    assert budget.own(65, 0) == 1 and budget.own(65, 31) == 1 and budget.own(65, 32) == 2
    group = Group("p", 65, 3)
    running = [Sample(uid=i, group=0, index=i, prompt_len=group.prompt_len) for i in range(3)]
    assert budget.in_use(running) == 2 + 3  # the prompt's 2 full blocks once, one own block per sample


class _RecordingPagedKVBudget(PagedKVBudget):
    """The real budget, recording the blocks the running set needs before every step and its projected peak."""

    seen: list[tuple[int, int]] = []

    def overflows(self, ledger) -> bool:
        self.seen.append((self.in_use(ledger.running), self.projected_peak(ledger.running)))
        return super().overflows(ledger)


@pytest.mark.parametrize("blocks", [19, 39])
def test_exact_predictions_fill_the_blocks_and_never_overflow(blocks):
    _RecordingPagedKVBudget.seen = []
    budget = _RecordingPagedKVBudget(blocks, 32)
    res = simulate(TRACE, "oracle", budget, "oracle", max_len=96)
    in_use, peaks = np.array(_RecordingPagedKVBudget.seen).T
    assert res.preemptions == 0 and in_use.max() <= blocks and peaks.max() == blocks  # the cache fills, exactly
    print(f"{blocks} blocks: paged {res.decode_steps} steps")


def test_a_budget_that_holds_no_sample_says_so():
    with pytest.raises(ValueError, match="kv_budget=3 blocks of 32 tokens cannot hold one sample"):
        simulate(TRACE, "infinite", PagedKVBudget(3, 32), "oracle", max_len=96)
    with pytest.raises(ValueError, match="kv_blocks must be >= 1"):
        PagedKVBudget(0, 32)


@pytest.mark.parametrize("policy, predictor", [("plain", "none"), ("infinite", "noisy:0.5")])
def test_the_simulator_stops_where_the_blocks_run_out_and_preempts_there(monkeypatch, policy, predictor):
    """Between retirements the simulator jumps many steps at once; under a paged budget it must stop at the step
    after which the next one outgrows the blocks (whole blocks fill before raw tokens do), so the engine preempts
    there and no step ever allocates more than the budget. (Jumping by raw tokens ran past it.) ``plain`` (verl's
    submission: admit while the next step fits, preempt when it no longer does) overflows all the time."""
    from verl_infsample.engines.simulated import SimulatedEngine

    budget = PagedKVBudget(19, 32, max_running=32)
    allocated: list[int] = []
    step = SimulatedEngine.step

    def checked(engine, sched):
        finished, steps = step(engine, sched)
        allocated.extend(budget.in_use(sched.running, ahead) for ahead in range(steps))  # each step of the jump
        return finished, steps

    monkeypatch.setattr(SimulatedEngine, "step", checked)
    res = simulate(TRACE, policy, budget, predictor, max_len=96, seed=3)
    assert res.preemptions > 0 and max(allocated) <= budget.blocks
    assert max(allocated) == budget.blocks  # it does fill the blocks

