"""The plan as vLLM request priorities (``vllm.priority``): lower runs first, equal ones by arrival."""

import pytest

from verl_infsample.integration.rollout.vllm.priority import StepPriorities


def test_arrival_is_first_come_first_served():
    p = StepPriorities("arrival")
    assert {p.of(g, length) for g, length in [("a", 10), ("b", 300), ("a", 10)]} == {0}


def test_group_keeps_a_groups_samples_together_in_first_arrival_order():
    p = StepPriorities("group")
    order = [p.of(g, 0) for g in ["b", "a", "b", "c", "a"]]
    assert order[2] == order[0] and order[4] == order[1]  # a group's samples share one priority
    assert order[0] < order[1] < order[3]  # every sample of b before any of a, wherever it arrived
    p.new_step()
    assert p.of("c", 0) == order[0]  # a new step counts its groups afresh


def test_every_priority_fits_vllms_int64():
    p = StepPriorities("longest_first")
    assert -(1 << 63) <= p.probe("huge", 10 ** 9) < p.of("huge", 10 ** 9) < p.of("g", 0, own=False) < (1 << 63)


def test_longest_first_orders_groups_by_predicted_length_then_arrival():
    p = StepPriorities("longest_first")
    short, long_, long2 = p.of("short", 20), p.of("long", 400), p.of("long2", 400)
    assert long_ < long2 < short  # the longest start first; equal predictions keep their groups in arrival order
    assert p.of("long", 400) == long_  # a group's samples share one priority
    assert p.of("short", 20.4) == short  # whole tokens: a noisy prediction does not split a group


def test_a_groups_prediction_keeps_whole_requests_in_group_order_its_own_ranks_them_longest_first():
    """Whole requests predicted only by their prompt's history run in their groups' order, whatever the history says
    (ranking whole groups by length fills vLLM's KV with the long ones); samples predicted one by one (the oracle,
    or a probe's rest) run longest first; probes rank by their group's prediction, before everything."""
    from verl_infsample.core.predictor import HistoryPredictor, OraclePredictor
    from verl_infsample.core.sample import Group, Sample
    from verl_infsample.integration.rollout.vllm.order import VLLMRequestOrder

    short, long_ = [1] * 8, [2] * 8
    history = VLLMRequestOrder("longest_first", HistoryPredictor(max_len=1000))
    for prompt, length in ((short, 10), (long_, 900)):
        history.predictor.observe(Group(history.arrive(prompt).group.prompt_id, 8, 1), Sample(0, 0, 0, 8), length)
    history.new_step()
    first, second = history.arrive(short), history.arrive(long_)
    assert first.priority < second.priority  # arrival, not the history's 900 tokens
    p = StepPriorities("longest_first")
    assert p.of("short", 10, own=False) == p.of("short", 900, own=False) < p.of("long", 900, own=False)
    assert p.of("x", 900) < p.of("y", 10) and p.probe("long", 900) < p.probe("short", 10) < p.of("z", 10 ** 6)
    oracle = VLLMRequestOrder("longest_first", OraclePredictor())
    assert oracle.arrive(short, true_len=10).priority > oracle.arrive(long_, true_len=900).priority


def test_unknown_ordering_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown ordering 'sjf'; choose one of: arrival, group, longest_first"):
        StepPriorities("sjf")
