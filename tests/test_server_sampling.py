"""Every sampling parameter verl's clients send, on the transformers engine's server: honoured, or refused by name
with the alternative (never dropped); requests that differ in one are never decoded as one group."""

import asyncio
from pathlib import Path

import pytest

CONFIGS = str(Path(__file__).resolve().parents[1] / "configs")


def _server(model_dir, batch_window_ms=0, response_length=24):
    from hydra import compose, initialize_config_dir

    from verl_infsample.integration.rollout.server import InfiniteServer

    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="infinite_grpo", overrides=[
            f"actor_rollout_ref.rollout.response_length={response_length}", "actor_rollout_ref.rollout.prompt_length=64",
            "actor_rollout_ref.rollout.custom.slots=8", "actor_rollout_ref.rollout.custom.threads=1",
            f"actor_rollout_ref.rollout.custom.batch_window_ms={batch_window_ms}"])
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
    prompt = tiny_prompts[0][2]
    a = [o.token_ids for o in generate(server, prompt, 4, seed=11)]
    assert a == [o.token_ids for o in generate(server, prompt, 4, seed=11)]
    assert a != [o.token_ids for o in generate(server, prompt, 4, seed=12)]


def test_requests_that_differ_in_a_parameter_are_not_one_group(server, tiny_prompts):
    prompt = tiny_prompts[0][1]

    async def run():
        return await asyncio.gather(
            server.generate(prompt, {"temperature": 1.0, "max_tokens": 2, "ignore_eos": True}, "short", session_id=0),
            server.generate(prompt, {"temperature": 1.0, "ignore_eos": True}, "long", session_id=0))
    short, long_ = asyncio.run(run())
    assert (len(short.token_ids), len(long_.token_ids)) == (2, 24)


@pytest.mark.parametrize("key, value", [("min_tokens", 2), ("presence_penalty", 0.5), ("frequency_penalty", 0.5),
                                        ("repetition_penalty", 1.1), ("logit_bias", {1: 2.0})])
def test_what_the_engine_cannot_honour_is_refused_by_name(server, tiny_prompts, key, value):
    with pytest.raises(ValueError, match=rf"request r0: .*{key}.*custom\.engine=vllm"):
        generate(server, tiny_prompts[0][0], 1, **{key: value})
    neutral = {"min_tokens": 0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}
    if key in neutral:  # at its neutral value a key is accepted (verl always sends repetition_penalty=1.0)
        assert generate(server, tiny_prompts[0][0], 1, **{key: neutral[key]})[0].stop_reason == "completed"


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


def test_a_prompt_longer_than_the_context_fails_alone(server, tiny_prompts):
    async def run():
        return await asyncio.gather(server.generate(list(range(3, 3 + 100)), {"temperature": 1.0}, "long"),
                                    server.generate(tiny_prompts[0][0], {"temperature": 1.0}, "good"),
                                    return_exceptions=True)
    long_, good = asyncio.run(run())
    assert isinstance(long_, ValueError) and "request long: prompt of 100 tokens leaves no room" in str(long_)
    assert "prompt_length=64" in str(long_) and good.stop_reason == "completed"


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
