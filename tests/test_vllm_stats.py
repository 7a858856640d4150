"""``vllm_stats``: one figure set, from vLLM's own per-step stats, for verl's vLLM server and ours; and the cleanup
of what a CPU run leaves in /dev/shm and /tmp (``tests/leftovers.py``)."""

import multiprocessing
import os
import subprocess
import sys
import textwrap
from multiprocessing import shared_memory


def test_the_stats_logger_sums_vllms_steps_and_verls_server_builds_its_engine_with_it():
    code = textwrap.dedent("""
        import inspect, types
        import verl
        from vllm.config import CacheConfig
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.metrics.stats import IterationStats, SchedulerStats
        from verl.workers.rollout.vllm_rollout import vllm_async_server as server
        from verl_infsample.integration.rollout.vllm import stats as vllm_stats

        assert server.AsyncLLM is AsyncLLM
        vllm_stats.instrument(server)
        vllm_stats.instrument(server)  # idempotent
        wrapped = server.AsyncLLM
        assert issubclass(wrapped, AsyncLLM) and wrapped is not AsyncLLM
        # verl passes disable_log_stats / enable_log_requests only where the signature shows them
        assert {"disable_log_stats", "enable_log_requests"} <= set(inspect.signature(wrapped.from_vllm_config).parameters)

        cache = CacheConfig(block_size=16)
        cache.num_gpu_blocks = 200
        config = types.SimpleNamespace(cache_config=cache, scheduler_config=types.SimpleNamespace(max_num_seqs=2))
        logger = vllm_stats._logger_class()(config)
        for step, (preempted, generated, prefilled, usage) in enumerate([(0, 4, 40, 0.25), (1, 3, 0, 0.5), (0, 2, 8, 0.1)]):
            it = IterationStats()
            it.iteration_timestamp = 100.0 + step
            it.num_preempted_reqs, it.num_generation_tokens = preempted, generated
            it.prompt_token_stats.computed = prefilled
            logger.record(SchedulerStats(kv_cache_usage=usage, num_running_reqs=4 - step), it)
        logger.record(SchedulerStats(kv_cache_usage=0.9, num_running_reqs=7), None)  # no output: idle, not a step
        m = vllm_stats.pop_step_metrics()
        print(m["infsample/decode_steps"], m["infsample/preemptions"], m["infsample/tokens_computed"],
              m["infsample/peak_kv_blocks"], m["infsample/kv_blocks"], m["infsample/wall_s"],
              m["infsample/running_rows"])
        print(vllm_stats.pop_step_metrics()["infsample/decode_steps"])  # popped: the next step starts at zero

        # the arrival bound, 2 slots: a sample (probe "a-probe" and rest "a") arrives before the first step, 1 + 3
        # tokens; "c" 3 tokens as well; "b" (2 tokens) arrives after four steps' outputs: it cannot end before step 6
        from vllm.v1.engine import FinishReason
        from vllm.v1.metrics.stats import FinishedRequestStats
        done = {101.0: [("a-probe", 1.5, 1)], 102.0: [("c", 2.5, 3)], 104.0: [("a", 2.5, 3), ("b", 0.5, 2)]}
        for t in (100.0, 101.0, 102.0, 103.0, 104.0):
            it = IterationStats()
            it.iteration_timestamp = t
            it.finished_requests = [FinishedRequestStats(FinishReason.LENGTH, request_id=rid, e2e_latency=e2e,
                                                         num_generation_tokens=n) for rid, e2e, n in done.get(t, [])]
            logger.record(SchedulerStats(num_running_reqs=2), it)
        m = vllm_stats.pop_step_metrics()
        print(m["infsample/arrival_bound_steps"], m["infsample/samples"])

        # drafts: two rows drafted 3 and 2 tokens and accepted 2 and 0 (gaining 3 and 1 tokens)
        from vllm.v1.spec_decode.metrics import SpecDecodingStats
        spec = SpecDecodingStats.new(3)
        spec.observe_draft(3, 2)
        spec.observe_draft(2, 0)
        it = IterationStats()
        it.iteration_timestamp, it.num_generation_tokens = 200.0, 4
        logger.record(SchedulerStats(num_running_reqs=2, spec_decoding_stats=spec), it)
        from verl_infsample.integration.rollout.metrics import merge_rollout_metrics
        m = merge_rollout_metrics([vllm_stats.pop_step_metrics()], parallel=True)  # as the trainer gets them
        print(m["infsample/spec_drafted"], m["infsample/spec_accepted"], m["infsample/spec_tokens_per_step"],
              *(m[f"infsample/spec_acceptance_pos{j}"] for j in range(3)), "infsample/spec_drafted_pos0" in m)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    first, second, arrivals, drafts = out.stdout.strip().splitlines()[-4:]
    # 3 steps, 1 preemption, 9 generated + 48 prefilled, peak usage 0.9 of 200 blocks (seen while idle), 2 s, rows
    # running 4 + 3 + 2 over the steps
    assert first.split() == ["3", "1", "57", "180", "200", "2.0", "9"]
    assert second == "0"
    # max(longest 4, 9 tokens / 2 slots) would say 5; "b" reached vLLM after step 4's output: 4 + 2
    assert arrivals.split() == ["6", "4"]
    # 5 drafted, 2 accepted; 4 tokens over 2 rows; by position: 1 of 2, 1 of 2, 0 of 1; the counts stay inside
    assert drafts.split() == ["5", "2", "2.0", "0.5", "0.5", "0.0", "False"]


def test_only_segments_sockets_and_files_that_nothing_uses_are_removed(tmp_path):
    import socket
    import uuid

    import leftovers as shm

    before = shm.listing()
    kept = shared_memory.SharedMemory(create=True, size=4096)  # mapped by this process: in use
    orphan = shared_memory.SharedMemory(create=True, size=4096)
    orphan.close()  # unmapped, never unlinked: what a killed process leaves
    bound, dead = (f"{shm.TMP}/{uuid.uuid4()}" for _ in range(2))
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(bound)  # a live vLLM queue's socket
    closed = socket.socket(socket.AF_UNIX)
    closed.bind(dead)
    closed.close()  # its process gone, the file stays
    held, stale = (f"{shm.TMP}/vllm_dist_{uuid.uuid4().hex}" for _ in range(2))  # torch.distributed rendezvous files
    held_file = open(held, "wb")  # a live vLLM's
    open(stale, "wb").close()
    lock = multiprocessing.get_context("spawn").Lock()  # a live pool's semaphore, mapped under another name
    live_sem = next(n for n in shm.listing() - before if n.startswith("sem.mp-"))
    try:
        assert {kept.name, orphan.name, bound, dead, held, stale} <= shm.listing() - before
        removed = shm.remove_left_behind(before)
        assert sorted(removed) == sorted([orphan.name, dead, stale])
        assert {kept.name, bound, held, live_sem} <= shm.listing() and not {orphan.name, dead, stale} & shm.listing()
        snapshot = tmp_path / "shm"
        subprocess.run([sys.executable, shm.__file__, "snapshot", str(snapshot)], check=True)
        assert set(snapshot.read_text().split()) == shm.listing()
    finally:
        del lock
        listening.close()
        held_file.close()
        for path in (bound, dead, held, stale):
            if os.path.exists(path):
                os.unlink(path)
        kept.close()
        kept.unlink()
        if os.path.exists(f"/dev/shm/{orphan.name}"):
            os.unlink(f"/dev/shm/{orphan.name}")


def test_requests_are_seeded_by_prompt_and_arrival_rank_afresh_each_step():
    """The same requests get the same seeds under any schedule; a new step or another prompt, other seeds; a
    caller's own seed stands. A recording class stands in for verl's vLLMHttpServer (which needs a running vLLM)."""
    import asyncio
    import types

    from infsample_lab.bench.request_seeds import seed_requests

    class FakeServerRecordingParams:
        def __init__(self):
            self.config, self.global_steps, self.seen = types.SimpleNamespace(seed=7), 1, []

        async def generate(self, prompt_ids, sampling_params, request_id, priority=0):
            self.seen.append((request_id, sampling_params.get("seed"), priority))
            return request_id

    module = types.SimpleNamespace(vLLMHttpServer=FakeServerRecordingParams)
    seed_requests(module)
    seed_requests(module)  # idempotent
    server = FakeServerRecordingParams()

    async def step(requests):
        return await asyncio.gather(*[server.generate(p, dict(params), rid, priority=3) for rid, p, params in requests])

    a, b = [1, 2, 3], [4, 5]
    assert asyncio.run(step([("a0", a, {}), ("a1", a, {}), ("b0", b, {}), ("own", b, {"seed": 11})])) == \
        ["a0", "a1", "b0", "own"]
    seeds = {rid: s for rid, s, _ in server.seen}
    assert seeds["own"] == 11 and len({seeds["a0"], seeds["a1"], seeds["b0"]}) == 3
    assert {p for _, _, p in server.seen} == {3}  # everything else passes through
    server.seen.clear()
    asyncio.run(step([("b0", b, {}), ("a0", a, {}), ("a1", a, {})]))  # another order, same step: ranks go on
    later = {rid: s for rid, s, _ in server.seen}
    assert seeds["a0"] not in (later["a0"], later["a1"])
    server.global_steps, server.seen = 2, []
    asyncio.run(step([("b0", b, {}), ("a0", a, {}), ("a1", a, {})]))  # a new step: ranks start again, new seeds
    fresh = {rid: s for rid, s, _ in server.seen}
    assert len({fresh["a0"], fresh["a1"], fresh["b0"]} | {seeds["a0"], seeds["a1"], seeds["b0"]}) == 6
    server.global_steps, server.seen = 1, []
    server._infsample_step = None  # as a fresh server at step 1: the first step's seeds again, whatever the order
    asyncio.run(step([("b0", b, {}), ("a1", a, {}), ("a0", a, {})]))
    again = {rid: s for rid, s, _ in server.seen}
    assert {again["a0"], again["a1"]} == {seeds["a0"], seeds["a1"]} and again["b0"] == seeds["b0"]
