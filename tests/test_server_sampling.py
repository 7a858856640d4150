"""Every sampling parameter verl's clients send, on the transformers engine's server: honoured with vLLM's meaning,
or refused by name with the alternative (never dropped); requests that differ in one are never decoded as one
group; a bad request fails alone."""

import asyncio
import re
from pathlib import Path

import pytest

CONFIGS = str(Path(__file__).resolve().parents[1] / "configs")


def _server(model_dir, batch_window_ms=0, response_length=24, overrides=()):
    from hydra import compose, initialize_config_dir

    from verl_infsample.integration.rollout.transformers.server import InfiniteServer

    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="infinite_grpo", overrides=[
            f"actor_rollout_ref.rollout.response_length={response_length}", "actor_rollout_ref.rollout.prompt_length=64",
            "actor_rollout_ref.rollout.custom.slots=8", "actor_rollout_ref.rollout.custom.threads=1",
            f"actor_rollout_ref.rollout.custom.batch_window_ms={batch_window_ms}", *overrides])
    return InfiniteServer(cfg.actor_rollout_ref.rollout, {"path": model_dir})


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    return _server(tiny_model_dir)


def generate(server, prompt, n=1, **params):
    async def run():
        return await asyncio.gather(*[server.generate(prompt, {"temperature": 1.0, **params}, f"r{i}",
                                                      session_id=i) for i in range(n)])
    return asyncio.run(run())


def test_max_tokens_and_max_new_tokens_cap_the_response(server, tiny_prompts):
    prompt = tiny_prompts[0][0]
    assert max(len(o.token_ids) for o in generate(server, prompt, 4, ignore_eos=True)) == 24
    for key in ("max_tokens", "max_new_tokens"):
        assert {len(o.token_ids) for o in generate(server, prompt, 4, ignore_eos=True, **{key: 3})} == {3}


def test_stop_token_ids_end_a_response_at_the_stop_and_ignore_eos_runs_past_eos(server, tiny_prompts):
    ends = [(p, out) for p in tiny_prompts[0]
            if (out := generate(server, p, 1, temperature=0.0)[0].token_ids)[-1] in server.stop_ids]
    assert ends  # greedy ends at eos on some prompt ...
    prompt, plain = ends[0]
    assert len(plain) < 24
    longer = generate(server, prompt, 1, temperature=0.0, ignore_eos=True)[0].token_ids
    assert len(longer) == 24 and longer[:len(plain) - 1] == plain[:-1]  # ... and without eos runs on to the cap
    stop = plain[len(plain) // 2]
    first = plain.index(stop)
    assert generate(server, prompt, 1, temperature=0.0, stop_token_ids=[stop])[0].token_ids == plain[:first + 1]


def test_a_requests_seed_fixes_its_samples(server, tiny_prompts):
    """The README's meaning of ``seed`` on this engine: it keys its group's streams (seed, prompt, sample index), so
    the same requests with the same seed give the same tokens again, while the group's samples differ from each
    other (under vLLM, identical requests with one seed return identical tokens)."""
    prompt = tiny_prompts[0][2]
    a = [o.token_ids for o in generate(server, prompt, 4, seed=11)]
    assert a == [o.token_ids for o in generate(server, prompt, 4, seed=11)]
    assert a != [o.token_ids for o in generate(server, prompt, 4, seed=12)]
    assert len({tuple(t) for t in a}) > 1


def test_requests_that_differ_in_a_parameter_are_not_one_group(server, tiny_prompts):
    prompt = tiny_prompts[0][1]

    async def run():
        return await asyncio.gather(
            server.generate(prompt, {"temperature": 1.0, "max_tokens": 2, "ignore_eos": True}, "short", session_id=0),
            server.generate(prompt, {"temperature": 1.0, "ignore_eos": True}, "long", session_id=0))
    short, long_ = asyncio.run(run())
    assert (len(short.token_ids), len(long_.token_ids)) == (2, 24)


@pytest.fixture
def reference_greedy(reference_model, vllm_logit_rules):
    """Greedy decoding by a plain full forward per token, with vLLM's rules written out by hand (conftest)."""
    import torch

    from verl_infsample.engines.sampling import SamplingParams

    def decode(prompt, stops, cap, params):
        rules = SamplingParams(max_new_tokens=cap, stop_token_ids=tuple(stops), logit_bias=tuple(
            (int(t), b) for t, b in (params.get("logit_bias") or {}).items()), **{
            k: v for k, v in params.items() if k != "logit_bias"})
        out = []
        while len(out) < cap:
            with torch.no_grad():
                logits = reference_model(torch.tensor([prompt + out])).logits[0, -1].double().tolist()
            x = vllm_logit_rules(logits, rules, prompt, out)
            out.append(max(range(len(x)), key=x.__getitem__))
            if out[-1] in stops:
                break
        return out
    return decode


@pytest.fixture(scope="module")
def reference_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype="float32").eval()


@pytest.fixture
def early_stopper(tiny_prompts, reference_greedy):
    """The held-out prompt whose greedy answer stops soonest (the model's build decides which: builds differ between
    machines), for the tests whose rule shows only on an answer that stops early."""
    prompts, stops = tiny_prompts
    lengths = [len(reference_greedy(p, stops, 24, {})) for p in prompts]
    assert min(lengths) < 6, f"no held-out prompt's greedy answer stops before 6 tokens: {lengths}"
    return prompts[lengths.index(min(lengths))]


HISTORY_PARAMS = [{"repetition_penalty": 1.8}, {"repetition_penalty": 0.5}, {"presence_penalty": -2.0},
                  {"frequency_penalty": -1.5}, {"min_tokens": 12}, {"logit_bias": {"2": 8.0}},
                  {"repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.5, "min_tokens": 6}]


@pytest.mark.parametrize("params", HISTORY_PARAMS, ids=lambda p: ",".join(p))
def test_penalties_min_tokens_and_logit_bias_decode_as_vllm_rules_say(server, tiny_prompts, reference_greedy, params,
                                                                       early_stopper):
    """Each history rule (and the logit bias), honoured: greedy decoding with it equals a plain reference decode with
    the rule written out by hand, and differs from greedy without it on some prompt (the rule is not dropped). Both
    kinds of request are sent at once: requests that differ in a parameter never decode as one group."""
    prompts = [*[p for p in tiny_prompts[0][:4] if p is not early_stopper][:3], early_stopper]

    async def run():
        return await asyncio.gather(*[server.generate(p, {"temperature": 0.0, **extra}, f"r{i}", session_id=0)
                                      for i, p in enumerate(prompts) for extra in ({}, params)])
    outs = asyncio.run(run())
    plain, ruled = [o.token_ids for o in outs[::2]], [o.token_ids for o in outs[1::2]]
    for p, a, b in zip(prompts, plain, ruled):
        assert a == reference_greedy(p, server.stop_ids, 24, {})
        assert b == reference_greedy(p, server.stop_ids, 24, params)
    assert plain != ruled
    if "min_tokens" in params:  # no stop before min_tokens
        assert all(len(b) >= params["min_tokens"] for b in ruled)
        assert any(len(a) < params["min_tokens"] for a in plain)


def test_temperature_min_p_top_k_and_top_p_at_their_limits_decode_greedily(server, tiny_prompts):
    prompt = tiny_prompts[0][3]
    greedy = generate(server, prompt, 1, temperature=0.0)[0].token_ids
    for key, value in (("temperature", 1e-4), ("min_p", 1.0), ("top_k", 1), ("top_p", 1e-9)):
        assert {tuple(o.token_ids) for o in generate(server, prompt, 4, **{key: value})} == {tuple(greedy)}, key
    sampled = {tuple(o.token_ids) for o in generate(server, prompt, 4, min_p=0.0)}
    assert len(sampled) > 1  # (without them the 4 samples differ)


def test_logprobs_come_back_only_when_asked(server, tiny_prompts):
    import math

    with_lp, without = generate(server, tiny_prompts[0][0], 1, logprobs=True)[0], generate(
        server, tiny_prompts[0][0], 1, logprobs=False)[0]
    assert len(with_lp.log_probs) == len(with_lp.token_ids) and all(lp <= 0 for lp in with_lp.log_probs)
    assert without.log_probs is None
    greedy = generate(server, tiny_prompts[0][0], 1, temperature=0.0, logprobs=True)[0]
    assert all(math.isfinite(lp) for lp in greedy.log_probs)


@pytest.mark.parametrize("key, value, says", [
    ("n", 2, "sampling parameter 'n' is not supported"), ("stop", ["."], "sampling parameter 'stop' is not supported"),
    ("allowed_token_ids", [1, 2], "'allowed_token_ids' is not supported"),
    ("repetition_penalty", 0.0, "repetition_penalty must be > 0"),
    ("presence_penalty", 3.0, "presence_penalty must be in \\[-2, 2\\]"),
    ("min_tokens", 30, "min_tokens must be in \\[0, max_new_tokens=24\\]"), ("min_p", -0.1, "min_p must be in"),
    ("logit_bias", {"100000": 1.0}, "logit_bias names token 100000, outside the model's vocabulary"),
    ("stop_token_ids", [-1], "stop_token_ids names token -1, outside"),
    ("max_tokens", 25, "max_tokens=25 exceeds actor_rollout_ref.rollout.response_length=24")])
def test_what_the_engine_cannot_honour_fails_its_request_alone_by_name(server, tiny_prompts, key, value, says):
    async def run():
        return await asyncio.gather(server.generate(tiny_prompts[0][0], {key: value}, "bad"),
                                    server.generate(tiny_prompts[0][0], {"temperature": 1.0}, "good"),
                                    return_exceptions=True)
    bad, good = asyncio.run(run())
    assert isinstance(bad, ValueError) and str(bad).startswith("request bad: "), bad
    assert re.search(says, str(bad)), str(bad)
    if "not supported" in says:  # the alternative that takes it
        assert "custom.engine=vllm" in str(bad)
    assert good.stop_reason == "completed" and good.token_ids


def test_the_rollout_configs_ignore_eos_and_repetition_penalty_are_the_requests_defaults(tiny_model_dir, early_stopper,
                                                                                        reference_greedy):
    """As verl's vLLM server: rollout.ignore_eos and rollout.repetition_penalty apply where a request says nothing."""
    server = _server(tiny_model_dir, overrides=["actor_rollout_ref.rollout.ignore_eos=true",
                                                "+actor_rollout_ref.rollout.repetition_penalty=1.8"])
    prompt = early_stopper  # (greedy ends at eos within a few tokens)
    out = generate(server, prompt, 1, temperature=0.0)[0].token_ids
    assert len(out) == 24 and out == reference_greedy(prompt, (), 24, {"repetition_penalty": 1.8})
    said = generate(server, prompt, 1, temperature=0.0, ignore_eos=False, repetition_penalty=1.0)[0].token_ids
    assert said == reference_greedy(prompt, server.stop_ids, 24, {}) != out


@pytest.mark.parametrize("params, message", [({"temperature": -0.5}, "temperature must be >= 0"),
                                             ({"top_p": 0.0}, "top_p must be in")])
def test_a_bad_value_fails_its_request_alone(server, tiny_prompts, params, message):
    async def run():
        return await asyncio.gather(server.generate(tiny_prompts[0][0], params, "bad"),
                                    server.generate(tiny_prompts[0][0], {"temperature": 1.0}, "good"),
                                    return_exceptions=True)
    bad, good = asyncio.run(run())
    assert isinstance(bad, ValueError) and message in str(bad) and "request bad" in str(bad)
    assert good.stop_reason == "completed" and good.token_ids


def test_a_prompt_longer_than_the_context_fails_alone(tiny_model_dir, tiny_prompts):
    """As verl's vLLM server: a prompt past rollout.prompt_length + response_length still gets one token (a late turn
    of a multi-turn agent); one that fills the model's context (rollout.max_model_len) fails alone."""
    server = _server(tiny_model_dir, overrides=["+actor_rollout_ref.rollout.max_model_len=120"])

    async def run(prompt):
        return await asyncio.gather(server.generate(prompt, {"temperature": 1.0, "ignore_eos": True}, "long"),
                                    server.generate(tiny_prompts[0][0], {"temperature": 1.0}, "good"),
                                    return_exceptions=True)
    past_budget, good = asyncio.run(run(list(range(3, 3 + 100))))
    assert len(past_budget.token_ids) == 1 and good.stop_reason == "completed"
    near_context, _ = asyncio.run(run(list(range(3, 3 + 110))))
    assert len(near_context.token_ids) == 1
    too_long, good = asyncio.run(run(list(range(3, 3 + 120))))
    assert isinstance(too_long, ValueError) and "request long: prompt of 120 tokens leaves no room" in str(too_long)
    assert "context of 120 tokens (actor_rollout_ref.rollout.max_model_len" in str(too_long)
    assert good.stop_reason == "completed"


def test_an_engine_failure_fails_its_batch_loudly_and_the_next_batch_is_served(server, tiny_prompts, monkeypatch):
    """A rollout that raises inside the engine: every request of its batch gets the exception (none returns a
    partial group as complete), and the server decodes the next requests as before."""
    real = server.engine.rollout
    calls = []

    def fails_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("device lost")
        return real(*args, **kwargs)

    monkeypatch.setattr(server.engine, "rollout", fails_once)

    async def batch(tag):
        return await asyncio.gather(*[server.generate(p, {"temperature": 1.0}, f"{tag}{i}", session_id=i)
                                      for p in tiny_prompts[0][:2] for i in range(3)], return_exceptions=True)
    failed = asyncio.run(batch("a"))
    assert len(failed) == 6 and all(isinstance(r, RuntimeError) and "device lost" in str(r) for r in failed)
    served = asyncio.run(batch("b"))
    assert all(r.stop_reason == "completed" and r.token_ids for r in served) and len(calls) == 2


def test_a_steady_stream_of_requests_does_not_hold_back_the_first(tiny_model_dir, tiny_prompts):
    """The batch window waits for arrivals to pause, 10 windows at most: with a request every 30 ms (each within the
    50 ms window of the last) the first is answered while the stream goes on, and every request is answered."""
    server = _server(tiny_model_dir, batch_window_ms=50)
    prompt, params = tiny_prompts[0][0], {"temperature": 1.0, "max_tokens": 2}

    async def run():
        tasks = [asyncio.create_task(server.generate(prompt, params, "r0", session_id=0))]
        answered_at = None
        for i in range(1, 60):  # 1.8 s of requests
            await asyncio.sleep(0.03)
            if answered_at is None and tasks[0].done():
                answered_at = i
            tasks.append(asyncio.create_task(server.generate(prompt, params, f"r{i}", session_id=i)))
        return answered_at, await asyncio.gather(*tasks)

    answered_at, outs = asyncio.run(run())
    assert answered_at is not None and answered_at < 59
    assert len(outs) == 60 and all(o.stop_reason == "completed" for o in outs)


def test_a_second_wave_joins_the_running_rollout(tiny_model_dir, tiny_prompts):
    """Streaming: 12 samples of 40 tokens on 8 slots (8, then 4 with 4 slots idle: 80 steps); a second wave of 4
    four-token samples arrives while the first round decodes. It joins the running rollout (one batch) instead of
    waiting for it, its samples take the slots the first wave leaves idle and are answered before the first wave's
    last, and the steps are those of one batch of both waves (80), not of two batches one after the other (84)."""
    server = _server(tiny_model_dir, response_length=40)
    first, second = tiny_prompts[0][0], tiny_prompts[0][1]
    order = []

    async def ask(prompt, tag, i, max_tokens):
        out = await server.generate(prompt, {"temperature": 1.0, "ignore_eos": True, "max_tokens": max_tokens},
                                    f"{tag}{i}", session_id=i)
        order.append(tag)
        return out

    async def run():
        wave1 = [asyncio.create_task(ask(first, "a", i, 40)) for i in range(12)]
        while server.engine.forward_passes < 10:  # the first round decodes
            await asyncio.sleep(0.002)
        assert not any(t.done() for t in wave1)
        wave2 = [asyncio.create_task(ask(second, "b", i, 4)) for i in range(4)]
        return await asyncio.gather(*wave1), await asyncio.gather(*wave2)

    wave1, wave2 = asyncio.run(run())
    assert [len(o.token_ids) for o in wave1] == [40] * 12 and [len(o.token_ids) for o in wave2] == [4] * 4
    metrics = asyncio.run(server.pop_step_metrics())
    assert metrics["infsample/batches"] == 1 and metrics["infsample/joined"] == 4
    assert metrics["infsample/samples"] == 16
    assert order.index("b") < len(order) - 1 - order[::-1].index("a")  # a second-wave answer before the first's last
    assert metrics["infsample/decode_steps"] == 80  # one batch of both: the joiners ran in freed slots
