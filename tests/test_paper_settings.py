"""The paper-setting goals, asserted on the simulator (decode steps are exact counts, not timings)."""

import numpy as np
import pytest

from verl_infsample.core import KVBudget, SlotPool, synth_trace
from verl_infsample.engines import simulate

PAPER = dict(prompts=1, group_size=32, max_len=1024, dist="lognormal")  # B=1, G=32, M=8


@pytest.mark.parametrize("seed", range(10))
def test_paper_setting_oracle_and_naive(seed):
    trace = synth_trace(seed=seed, **PAPER)
    oracle = simulate(trace, "oracle", SlotPool(8))
    naive = simulate(trace, "naive", SlotPool(8))
    infinite = simulate(trace, "infinite", SlotPool(8), "noisy:0.3", seed=seed)
    assert oracle.decode_steps <= 1.05 * oracle.lower_bound_steps
    assert naive.decode_steps > infinite.decode_steps


def test_paper_setting_with_noisy_predictions_averaged_over_seeds():
    ratios, naive_ratios = [], []
    for seed in range(10):
        trace = synth_trace(seed=seed, **PAPER)
        inf = simulate(trace, "infinite", SlotPool(8), "noisy:0.3", seed=seed)
        ratios.append(inf.decode_steps / inf.lower_bound_steps)
        naive_ratios.append(simulate(trace, "naive", SlotPool(8)).decode_steps / inf.decode_steps)
    assert np.mean(ratios) <= 1.08
    assert np.mean(naive_ratios) >= 1.5


def test_many_prompts_reach_the_lower_bound():
    trace = synth_trace(64, 64, 1024, "lognormal", seed=0)
    res = simulate(trace, "infinite", SlotPool(16), "noisy:0.3")
    assert res.decode_steps <= 1.01 * res.lower_bound_steps


@pytest.mark.parametrize("prompts", [1, 16])
def test_kv_budget_beats_slot_capped_continuous_without_preemption(prompts):
    trace = synth_trace(prompts, 32, 1024, "lognormal", seed=0)
    budget = 8 * (max(p.prompt_len for p in trace) + 1024)  # what 8 worst-case slots would need
    inf = simulate(trace, "infinite", KVBudget(budget), "oracle", max_len=1024)
    cont = simulate(trace, "continuous", SlotPool(8), max_len=1024)
    assert inf.decode_steps < cont.decode_steps
    assert inf.preemptions == 0
    assert inf.peak_kv_tokens <= budget
