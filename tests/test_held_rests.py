"""The server's hold on probes' rests (``InfiniteVLLMServer`` and its ``EngineGate``: ``turn``, ``release``,
``abort_all_requests``), in front of a stand-in for vLLM (``VLLMStandIn``: verl's ``generate`` answers a request when
the test lets it; the real vLLM runs behind this code in the tool-agent GRPO tests, whose aborts land where they
happen to). Here every case is placed: rests held while vLLM is full, released in the plan's order as requests come
back, an abort that answers each held rest with its probe's tokens, a caller that goes away."""

import asyncio

import pytest

from test_verl_rollout import compose


class VLLMStandIn:
    """Stands in for vLLM behind verl's ``vLLMHttpServer.generate``: each request waits until ``finish`` lets it
    end, then returns ``max_tokens`` tokens (a probe's finish reason "length" reported as vLLM's stat logger reports
it, once the output is out); ``abort`` ends every
    waiting one "aborted" with no tokens."""

    def __init__(self):
        self.waiting: dict[str, asyncio.Future] = {}
        self.sent: list[str] = []
        self.params: dict[str, dict] = {}  # each request's sampling parameters as vLLM got them
        self.reasons: dict[str, str | None] = {}  # a probe's finish reason, where not "length" (None: never told)

    async def generate(self, server, prompt_ids, sampling_params, request_id, *args, priority=0, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.sent.append(request_id)
        self.params[request_id] = sampling_params
        done = self.waiting[request_id] = asyncio.get_running_loop().create_future()
        if not await done:
            return TokenOutput(token_ids=[], log_probs=[], stop_reason="aborted")
        n = int(sampling_params["max_tokens"])
        if request_id.endswith("-probe"):  # vLLM hands out the output, then records the step (its finish reasons)
            from verl_infsample.integration.rollout.vllm import stats

            reason = self.reasons.get(request_id, "length")
            if reason is not None:
                asyncio.get_running_loop().call_soon(stats.report_finished, request_id, reason)
        return TokenOutput(token_ids=[len(prompt_ids) % 50 + 1] * n, log_probs=[-0.5] * n, stop_reason="completed")

    async def finish(self, request_id: str) -> None:
        self.waiting.pop(request_id).set_result(True)
        for _ in range(10):  # let the server hear of it (its output, then vLLM's record of the step) and act
            await asyncio.sleep(0)

    async def abort(self, server, *args, **kwargs):
        for done in self.waiting.values():
            done.set_result(False)
        self.waiting.clear()
        return {"aborted_count": 0}


@pytest.fixture(params=["off"])
def server(request, monkeypatch, tiny_checkpoint_dir):
    """An ``InfiniteVLLMServer`` with verl's config (2 slots: 4 requests inside vLLM at most, learned:k=4 probes;
    ``custom.speculative`` the fixture's parameter), verl's ``generate`` and ``abort_all_requests`` answered by the
    stand-in."""
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    from verl_infsample.integration.rollout.vllm.server import InfiniteVLLMServer

    cfg = compose(f"actor_rollout_ref.model.path={tiny_checkpoint_dir}", "actor_rollout_ref.rollout.custom.engine=vllm",
                  "actor_rollout_ref.rollout.custom.slots=2", "actor_rollout_ref.rollout.n=6",
                  "actor_rollout_ref.rollout.custom.predictor='learned:k=4'",
                  f"actor_rollout_ref.rollout.custom.speculative={request.param}",
                  "actor_rollout_ref.rollout.max_model_len=512", "trainer.device=cpu")
    vllm = VLLMStandIn()
    monkeypatch.setattr(vLLMHttpServer, "generate", lambda self, *a, **kw: vllm.generate(self, *a, **kw))
    monkeypatch.setattr(vLLMHttpServer, "abort_all_requests", lambda self, *a, **kw: vllm.abort(self, *a, **kw))
    s = object.__new__(InfiniteVLLMServer)
    s.config = s._init_config(cfg.actor_rollout_ref.rollout)
    s._pd_decode_peers = []
    s._init_scheduling()
    s.vllm = vllm
    return s


async def _six_requests_probes_back(server, probes: int) -> list:
    """Six requests of one prompt sent (12 tokens each, probed), the first ``probes`` of their probes come back."""
    calls = [asyncio.ensure_future(server.generate([1, 2, 3], {"max_tokens": 12}, f"r{i}")) for i in range(6)]
    await asyncio.sleep(0)
    for i in range(probes):
        await server.vllm.finish(f"r{i}-probe")
    return calls


def test_the_engine_keeps_kv_free_at_admission_unless_the_user_set_it(server):
    """Probed rests run longest first: the server builds vLLM with its ``watermark``; a user's
    ``rollout.engine_kwargs.vllm.watermark`` wins."""
    from verl_infsample.integration.rollout.vllm.priority import REST_WATERMARK

    built = {}
    server._preprocess_engine_kwargs(built)
    assert built["watermark"] == REST_WATERMARK and built["scheduling_policy"] == "priority"
    users = {"watermark": 0.0}
    server._preprocess_engine_kwargs(users)
    assert users["watermark"] == 0.0


def test_rests_wait_while_vllm_is_full_and_go_in_as_requests_come_back(server):
    async def scenario():
        vllm, order = server.vllm, server.order
        assert order.room == 4 and order.probe_tokens == 4
        calls = [asyncio.ensure_future(server.generate([1, 2, 3], {"max_tokens": 12}, f"r{i}")) for i in range(6)]
        await asyncio.sleep(0)
        assert sorted(vllm.sent) == sorted(f"r{i}-probe" for i in range(6)) and order.in_engine == 6
        for i in range(3):  # three probes end: vLLM holds 5, 4, then 3 requests
            await vllm.finish(f"r{i}-probe")
        assert order.held == 2 and [r for r in vllm.sent if not r.endswith("-probe")] == ["r0"]
        assert order.in_engine == 4  # the three probes left, and r0's rest went in
        await vllm.finish("r3-probe")  # room for one more: one held rest goes in, another is held
        assert order.held == 2 and order.in_engine == 4
        for rid in ("r0", "r4-probe", "r5-probe"):
            await vllm.finish(rid)
        while vllm.waiting:
            await vllm.finish(next(iter(vllm.waiting)))
        outs = await asyncio.gather(*calls)
        assert order.held == 0 and order.in_engine == 0
        assert all(o.stop_reason == "completed" and len(o.token_ids) == 12 == len(o.log_probs) for o in outs)
        assert server._counts["rests_held"] >= 2 and server._counts["probe_continuations"] == 6
        assert server.gate.plan_ms > 0  # the order's time, for infsample/plan_ms

    asyncio.run(scenario())


@pytest.mark.parametrize("server", ["off", "group"], indirect=True)
def test_a_server_with_drafts_says_at_start_what_they_cost(server, caplog):
    """vLLM schedules synchronously with these drafters: the server says so once, at start, only with drafts on."""
    said = [r for r in caplog.get_records("setup") if "schedules every step synchronously" in r.getMessage()]
    assert len(said) == (server.settings.speculative != "off")


@pytest.mark.parametrize("server", ["group"], indirect=True)
def test_the_drafter_hears_a_probe_as_its_samples_head_and_its_rest_at_the_prediction_after_it(server):
    """With group drafts, a probe tells the drafter it is a head (its tokens are no answer of their own) at the
    prediction it was sent with; its rest, whose prompt carries the probe's tokens, counts its response from the
    sample's prompt, at the sample's prediction as it stands after the probe."""
    from verl_infsample.drafter.hints import GROUP_ARG, HEAD_ARG, PREDICTED_ARG, RESPONSE_START_ARG

    after_probe, predicted = server.order.after_probe, []

    def recorded_after_probe(request, opening):
        priority = after_probe(request, opening)
        predicted.append(request.sample.predicted_len)
        return priority

    server.order.after_probe = recorded_after_probe

    async def scenario():
        vllm = server.vllm
        call = asyncio.ensure_future(server.generate([1, 2, 3], {"max_tokens": 12}, "r0"))
        await asyncio.sleep(0)
        head = vllm.params["r0-probe"]["extra_args"]
        assert head[HEAD_ARG] and RESPONSE_START_ARG not in head
        await vllm.finish("r0-probe")
        rest = vllm.params["r0"]["extra_args"]
        assert rest == {GROUP_ARG: head[GROUP_ARG], RESPONSE_START_ARG: 3, PREDICTED_ARG: int(predicted[0] or 12)}
        await vllm.finish("r0")
        assert len((await call).token_ids) == 12

    asyncio.run(scenario())


def test_an_abort_answers_each_held_rest_with_its_probes_tokens(server):
    """verl's abort (weight sync, colocate_async): a held rest never reaches vLLM; its sample comes back "aborted"
    with the probe's 4 tokens, which verl resumes; what vLLM held comes back aborted as vLLM returns it."""
    async def scenario():
        vllm, order = server.vllm, server.order
        calls = await _six_requests_probes_back(server, 3)
        held = order.held
        await server.abort_all_requests()
        outs = await asyncio.wait_for(asyncio.gather(*calls), 5)
        assert held == 2 and order.held == 0 and order.in_engine == 0
        assert [o.stop_reason for o in outs] == ["aborted"] * 6
        assert sorted(len(o.token_ids) for o in outs) == [0, 0, 0, 4, 4, 4]  # r0: its probe, its rest in vLLM
        assert server._counts["held_aborted"] == 2
        assert not [r for r in vllm.sent if r in ("r1", "r2")]  # the held ones never reached vLLM

    asyncio.run(scenario())


def test_a_caller_that_goes_away_while_its_rest_is_held_leaves_nothing_behind(server):
    async def scenario():
        vllm, order = server.vllm, server.order
        calls = await _six_requests_probes_back(server, 1)
        assert order.held == 1
        calls[0].cancel()
        await asyncio.sleep(0)
        assert order.held == 0 and order.in_engine == 5 and not server.gate._turns
        while vllm.waiting:
            await vllm.finish(next(iter(vllm.waiting)))
        outs = await asyncio.gather(*calls[1:])
        assert all(len(o.token_ids) == 12 for o in outs) and order.in_engine == 0 and "r0" not in vllm.sent

    asyncio.run(scenario())


def test_slots_vllm_left_free_while_rests_were_held_widen_the_room(server):
    """vLLM's stats of a step (its real ``SchedulerStats``, as its front end records them through ``vllm_stats``)
    with slots free and nothing waiting while rests are held: the server's count of what is inside vLLM ran ahead
    of vLLM (a round trip not yet heard of), so the room widens by the free slots and held rests go in at once. A
    step with requests waiting in vLLM, or none held here, changes nothing."""
    from vllm.v1.metrics.stats import SchedulerStats

    from verl_infsample.integration.rollout.vllm import stats as vllm_stats

    async def scenario():
        vllm, order = server.vllm, server.order
        calls = await _six_requests_probes_back(server, 3)
        assert order.held == 2 and order.room == 4 and order.in_engine == 4
        vllm_stats.report_step(SchedulerStats(num_running_reqs=1, num_waiting_reqs=2))  # vLLM has work waiting
        assert order.held == 2 and order.room == 4 and not server._counts["starved_steps"]
        vllm_stats.report_step(SchedulerStats(num_running_reqs=1, num_waiting_reqs=0))  # one of 2 slots free
        await asyncio.sleep(0)
        assert order.room == 5 and order.held == 1 and server._counts["starved_steps"] == 1
        assert sorted(r for r in vllm.sent if not r.endswith("-probe")) == ["r0", "r1"]
        while vllm.waiting:
            await vllm.finish(next(iter(vllm.waiting)))
        outs = await asyncio.gather(*calls)
        assert order.held == 0 and all(len(o.token_ids) == 12 for o in outs)
        vllm_stats.report_step(SchedulerStats(num_running_reqs=0, num_waiting_reqs=0))  # none held: no change
        assert order.room == 5 and server._counts["starved_steps"] == 1
        assert (await server.pop_step_metrics())["infsample/engine_room"] == 5

    asyncio.run(scenario())


def test_a_probe_that_stopped_at_its_last_token_ends_its_sample(server):
    """vLLM's finish reason, not the token count, says whether a sample goes on: a probe that stopped ("stop") on
    exactly its k-th token is the whole sample, and no rest is sent."""
    async def scenario():
        vllm = server.vllm
        vllm.reasons["r0-probe"] = "stop"
        call = asyncio.ensure_future(server.generate([1, 2, 3], {"max_tokens": 12}, "r0"))
        await asyncio.sleep(0)
        await vllm.finish("r0-probe")
        out = await asyncio.wait_for(call, 5)
        assert out.stop_reason == "completed" and len(out.token_ids) == 4 and vllm.sent == ["r0-probe"]
        assert server.order.in_engine == 0 and server._counts["probe_continuations"] == 0

    asyncio.run(scenario())


def test_a_probe_without_a_finish_reason_fails_loudly(server, monkeypatch):
    """Without vLLM's stat logger no finish reason comes: the request fails, naming why, rather than guess."""
    from verl_infsample.integration.rollout.vllm import server as vllm_server

    monkeypatch.setattr(vllm_server, "FINISH_REASON_TIMEOUT_S", 0.05)

    async def scenario():
        server.vllm.reasons["r0-probe"] = None
        call = asyncio.ensure_future(server.generate([1, 2, 3], {"max_tokens": 12}, "r0"))
        await asyncio.sleep(0)
        await server.vllm.finish("r0-probe")
        with pytest.raises(RuntimeError, match="no finish reason for 'r0-probe'"):
            await asyncio.wait_for(call, 5)
        assert server.order.in_engine == 0 and not server._probe_reasons

    asyncio.run(scenario())


def test_a_callers_priority_is_refused_by_name(server):
    """The plan sets every request's vLLM priority; a caller that sends its own is told so, nothing reaches vLLM."""
    with pytest.raises(ValueError, match=r"generate\(priority=5\).*custom.policy.*send priority=0"):
        asyncio.run(server.generate([1, 2, 3], {"max_tokens": 12}, "r0", priority=5))
    assert server.vllm.sent == []
