"""A sample decoded as its probe and its rest (``integration.rollout.vllm.probe``, ``vllm.order``): which requests may be
split, how their parameters split, how verl gets one response back, and where probes and rests stand in the plan."""

import pytest

from verl_infsample.integration.rollout.vllm.priority import StepPriorities
from verl_infsample.core.predictor import HistoryPredictor
from verl_infsample.integration.rollout.vllm import probe
from verl_infsample.integration.rollout.vllm.order import VLLMRequestOrder
from verl_infsample.integration.rollout.vllm.priority import REST_WATERMARK
from verl_infsample.predict import make_predictor
from verl_infsample.predict.features import TokenWindow

VERL_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


@pytest.mark.parametrize("params, context, why", [
    (VERL_DEFAULTS, {}, None),
    ({**VERL_DEFAULTS, "min_tokens": 3, "stop_token_ids": [7], "presence_penalty": 0.0, "stop": []}, {}, None),
    ({**VERL_DEFAULTS, "seed": 7}, {}, "seed"),
    (VERL_DEFAULTS, {"seeded": True}, "seed"),
    ({**VERL_DEFAULTS, "presence_penalty": 0.5}, {}, "presence_penalty"),
    ({**VERL_DEFAULTS, "frequency_penalty": 0.1}, {}, "frequency_penalty"),
    ({**VERL_DEFAULTS, "stop": ["\n\n"]}, {}, "stop"),
    ({**VERL_DEFAULTS, "structured_outputs": {"json": {}}}, {}, "structured_outputs"),
    (VERL_DEFAULTS, {"multimodal": True}, "multimodal input"),
    (VERL_DEFAULTS, {"routed_experts": True}, "rollout routing replay"),
    (VERL_DEFAULTS, {"kv_transfer": True}, "kv transfer"),
])
def test_only_requests_whose_parameters_mean_the_same_split_are_probed(params, context, why):
    assert probe.probe_refusal(params, **context) == why


def test_the_probe_and_the_rest_share_the_budget_and_min_tokens():
    head, rest = probe.split_params({**VERL_DEFAULTS, "max_tokens": 100, "min_tokens": 20}, 100, 16)
    assert head["max_tokens"] == 16 and rest["max_tokens"] == 84
    assert head["min_tokens"] == 16 and rest["min_tokens"] == 4  # no stop before the 20th token of the sample
    head, rest = probe.split_params({**VERL_DEFAULTS, "max_new_tokens": 50, "min_tokens": 5}, 50, 16)
    assert "max_new_tokens" not in head and head["min_tokens"] == 5 and "min_tokens" not in rest
    assert head["temperature"] == rest["temperature"] == 1.0 and head["logprobs"] is rest["logprobs"] is True


def test_verl_gets_one_response_tokens_logprobs_and_preemptions_of_both():
    from verl.workers.rollout.replica import TokenOutput

    head = TokenOutput(token_ids=[1, 2], log_probs=[-0.1, -0.2], stop_reason="completed", num_preempted=1,
                       extra_fields={"num_cached_tokens": 32, "global_steps": 3})
    rest = TokenOutput(token_ids=[3], log_probs=[-0.3], stop_reason="completed", num_preempted=0,
                       extra_fields={"num_cached_tokens": 48, "global_steps": 3})
    out = probe.join(head, rest)
    assert out.token_ids == [1, 2, 3] and out.log_probs == [-0.1, -0.2, -0.3] and out.num_preempted == 1
    assert out.stop_reason == "completed" and out.extra_fields == {"num_cached_tokens": 32, "global_steps": 3}
    aborted = probe.join(head, rest.model_copy(update={"stop_reason": "aborted", "log_probs": None}))
    assert aborted.stop_reason == "aborted" and aborted.token_ids == [1, 2, 3] and aborted.log_probs is None


def test_every_probe_runs_before_every_planned_request_in_the_plans_order():
    p = StepPriorities("longest_first")
    probes = [p.probe("short", 10), p.probe("long", 5000)]
    planned = [p.of("short", 10), p.of("long", 10 ** 9)]
    assert max(probes) < min(planned)
    assert probes[1] < probes[0]  # among probes too, the longest predicted group first
    assert -(1 << 63) <= p.probe("x", 10 ** 9) < (1 << 63)


def test_a_token_reading_predictor_probes_and_its_opening_reorders_the_rest():
    """learned:k=4 probes 4 tokens; once trained, two samples of one prompt whose openings differ get priorities
    of their own, the one whose opening led to long answers first. history does not probe."""
    assert VLLMRequestOrder("longest_first", HistoryPredictor(max_len=64)).probe_tokens == 0
    order = VLLMRequestOrder("longest_first", make_predictor("learned:k=4,min=4", max_len=64))
    assert order.probe_tokens == 4
    prompt = [5, 6, 7, 8]
    long_opening, short_opening = [9, 9, 9, 9], [1, 2, 3, 4]
    for step in range(30):  # the policy: a sample opening with 9s runs 60 tokens, otherwise 6
        order.new_step()
        for opening, length in ((long_opening, 60), (short_opening, 6)):
            r = order.arrive(prompt, group_size=2, max_tokens=64)
            assert r.probe
            order.after_probe(r, TokenWindow(opening))
            order.finished(r, length)
    order.new_step()
    a, b = (order.arrive(prompt, group_size=2, max_tokens=64) for _ in range(2))
    assert a.priority == b.priority  # before their probes the plan knows only their prompt
    short_rest = order.after_probe(a, TokenWindow(short_opening))
    long_rest = order.after_probe(b, TokenWindow(long_opening))
    assert long_rest < short_rest  # the sample predicted longer runs its rest first
    assert not order.arrive(prompt, max_tokens=4).probe  # a request no longer than the probe runs whole
    assert not order.arrive(prompt, max_tokens=64, may_probe=False).probe


def _probed(order, prompt, opening, group_size=8):
    """A sample of ``prompt`` that arrives, runs its probe in vLLM and goes on with ``opening``."""
    r = order.arrive(prompt, group_size=group_size, max_tokens=64)
    order.enter()
    order.leave()
    order.after_probe(r, TokenWindow(opening))
    return r


def test_held_rests_go_into_vllm_only_as_it_has_room_in_the_plans_order():
    """Rests wait in the order while ``room`` requests are inside vLLM; each release fills the room, best first."""
    order = VLLMRequestOrder("longest_first", make_predictor("noisy:0.0", max_len=64), probe_tokens=2, room=3)
    requests = []
    for uid, length in enumerate([10, 50, 20, 40, 30]):
        r = order.arrive([1, 2, 3], group_size=5, uid=uid, true_len=length, max_tokens=64)
        order.enter()
        requests.append(r)
    for r in requests:  # every probe is in vLLM: no rest may join them
        order.hold(r)
        assert order.release() == []
    assert sorted(order.held_remaining()) == [10, 20, 30, 40, 50]  # what the replay plans them by
    for _ in requests:
        order.leave()
    first = order.release()
    assert [r.sample.true_len for r in first] == [50, 40, 30] and order.in_engine == 3 and order.held == 2
    assert order.release() == []
    order.leave()
    assert [r.sample.true_len for r in order.release()] == [20]
    assert order.held == 1


def test_held_rests_are_ranked_at_release_by_what_the_step_has_taught_so_far():
    """A first step, nothing learned before: every rest is predicted alike when held. As the first samples finish
    the predictor learns that an opening of 9s runs long, and the rests still held are re-ranked: every long one
    goes in before the short ones left."""
    order = VLLMRequestOrder("longest_first", make_predictor("learned:k=4,min=4", max_len=64), room=2)
    long_opening, short_opening = [9, 9, 9, 9], [1, 2, 3, 4]
    order.new_step()
    held = [_probed(order, [5, 6, 7, 8], long_opening if i % 2 else short_opening, group_size=40) for i in range(40)]
    for r in held:
        order.hold(r)
    assert len({r.priority for r in held}) == 1  # nothing tells them apart yet
    released = []
    while order.held or order.in_engine:
        for r in order.release():
            released.append(r)
        done = released[-1] if order.in_engine else None
        if done is not None:  # the request inside vLLM the longest ends, with its true length
            order.leave()
            order.finished(done, 60 if done.sample.index % 2 else 6)
    assert len(released) == 40
    late = [r.sample.index % 2 for r in released[20:]]
    assert late == sorted(late, reverse=True)  # once learned: the long ones first, then the short
    assert sum(r.sample.index % 2 for r in released[-8:]) == 0  # the last ones out are short


def test_a_widened_room_lets_held_rests_in_and_bad_widths_are_refused():
    order = VLLMRequestOrder("longest_first", make_predictor("noisy:0.0", max_len=64), probe_tokens=2, room=1)
    requests = [order.arrive([1, 2], group_size=3, uid=u, true_len=n, max_tokens=64) for u, n in enumerate([9, 30, 20])]
    order.enter()
    for r in requests:
        order.hold(r)
    assert order.release() == []
    order.widen(2)
    assert [r.sample.true_len for r in order.release()] == [30, 20] and order.room == 3 and order.in_engine == 3
    with pytest.raises(ValueError, match="widen by >= 1"):
        order.widen(0)


@pytest.mark.parametrize("ordering, predictor, kept", [
    ("longest_first", "learned:k=4", REST_WATERMARK),  # probed: samples ranked by their own openings
    ("longest_first", "oracle", REST_WATERMARK),  # own predictions at submission
    ("longest_first", "history", 0.0),  # groups ranked as groups: verl's order, vLLM's default
    ("longest_first", "none", 0.0),
    ("group", "learned:k=4", 0.0),
])
def test_vllm_keeps_kv_free_at_admission_only_where_samples_run_longest_first(ordering, predictor, kept):
    assert VLLMRequestOrder(ordering, make_predictor(predictor, max_len=64)).engine_watermark() == kept


def test_an_abort_answers_every_held_rest_and_a_withdrawn_rest_is_never_released():
    order = VLLMRequestOrder("longest_first", make_predictor("learned:k=4,min=4", max_len=64), room=1)
    a, b, c = (_probed(order, [5, 6], [1, 2, 3, 4]) for _ in range(3))
    order.enter()  # vLLM is full
    for r in (a, b, c):
        order.hold(r)
    assert order.withdraw(b) is b and order.withdraw(b) is None
    assert order.drop_held() == [a, c] and order.held == 0
    order.leave()
    assert order.release() == [] and order.in_engine == 0


@pytest.mark.parametrize("seed", range(6))
def test_held_rests_in_any_order_of_events_each_go_in_once_and_the_room_holds(seed):
    """Random interleavings of what a server does (requests arrive and go in, come back, finish; rests are held,
    released, withdrawn, dropped by an abort; steps begin): every held rest leaves the order exactly once, released
    ones only while fewer than ``room`` requests are inside vLLM, in the plan's order at that moment."""
    import random

    rng = random.Random(seed)
    order = VLLMRequestOrder("longest_first", make_predictor("learned:k=2,min=3", max_len=64), room=rng.randint(1, 6))
    prompts = [[p, p + 1, p + 2] for p in range(1, 6)]
    inside: list = []  # requests in vLLM: probes (False) or released rests (True), with their OrderedRequest
    held: dict[int, object] = {}  # serial -> a held rest
    left: list[int] = []  # serials of rests that left the order (released, withdrawn, dropped)
    serial = {}  # id -> serial of every request made (each kept alive in ``made``)
    made = []
    for _ in range(400):
        op = rng.random()
        if op < 0.3:
            r = order.arrive(rng.choice(prompts), group_size=4, max_tokens=64)
            serial[id(r)] = len(made)
            made.append(r)
            order.enter()
            inside.append((False, r))
        elif op < 0.6 and inside:
            is_rest, r = inside.pop(rng.randrange(len(inside)))
            order.leave()
            if is_rest or rng.random() < 0.3:  # a rest, or a probe that ended its sample, finished
                order.finished(r, rng.randint(3, 64))
            else:
                order.after_probe(r, TokenWindow([rng.randint(0, 9), rng.randint(0, 9)]))
                order.hold(r)
                held[serial[id(r)]] = r
        elif op < 0.85:
            room = order.room - order.in_engine
            out = order.release()
            assert len(out) <= max(0, room)
            assert not order.held or order.in_engine >= order.room  # no room left open while rests wait
            assert [r.priority for r in out] == sorted(r.priority for r in out)
            for r in out:
                assert r.held == -1 and held.pop(serial[id(r)]) is r
                left.append(serial[id(r)])
                inside.append((True, r))
            if out and held:  # the best went first
                assert max(r.priority for r in out) <= min(h.priority for h in held.values())
        elif op < 0.92 and held:
            r = held.pop(rng.choice(sorted(held)))
            assert order.withdraw(r) is r and order.withdraw(r) is None
            left.append(serial[id(r)])
        elif op < 0.97:
            for r in order.drop_held():
                assert held.pop(serial[id(r)]) is r
                left.append(serial[id(r)])
        else:
            order.new_step()
        assert order.in_engine == len(inside) >= 0 and order.held == len(held)
    assert len(left) == len(set(left)) and len(left) > 20  # none left twice; the events did reach every path
