"""The KV-peak gate in front of vLLM (``core.kv_gate``), alone and in the replay (``replay.kv_gated``)."""

from __future__ import annotations

import numpy as np

from verl_infsample.core.capacity import PagedKVBudget
from verl_infsample.core.kv_gate import GatedRequest, KVPeakGate
from verl_infsample.replay.hardware import GPUS, MODELS, StepCostModel
from verl_infsample.replay.kv_gated import replay_gated
from verl_infsample.replay.vllm_replica import (ReplayRequest, ReplicaReplay, ReplicaSetup, model_config_dir,
                                                prompt_token_ids)

QWEN8 = MODELS["qwen3-8b"]


def test_the_gate_counts_shared_prompts_once_growth_by_its_clock_and_opens_when_empty():
    """Blocks of 16, a 64-token prompt (3 shared blocks, its last 16 tokens in each sample's own first block), each
    sample predicted 100 tokens: 8 blocks of its own at its end. Two samples of the group fit 21 blocks (3 + 16),
    a third does not (27), nor one of another group (3 + 3 + 24); once the clock has run the two near their end, a
    new one holds 2 blocks at their peak (21) and fits beside them; an empty engine takes any request."""
    gate = KVPeakGate(PagedKVBudget(21, 16, max_running=8))
    sample = GatedRequest("a", 64, 100)
    assert gate.admits(GatedRequest("b", 64, 10_000))  # nothing inside: never idle
    gate.enter("a0", sample)
    assert gate.admits(sample)
    gate.enter("a1", sample)
    assert not gate.admits(sample) and not gate.admits(GatedRequest("b", 64, 100))
    gate.tick(90)  # both are 10 tokens from their end: a third one's peak comes after theirs
    assert gate.admits(sample)
    gate.leave("a0")
    gate.leave("a1")
    assert gate.num_running == 0 and gate.admits(GatedRequest("b", 64, 10_000))
    small = KVPeakGate(PagedKVBudget(1000, 16, max_running=2))  # the engine's max_num_seqs binds too
    small.enter("x", GatedRequest("a", 8, 4))
    small.enter("y", GatedRequest("a", 8, 4))
    assert not small.admits(GatedRequest("a", 8, 4))


def test_the_gated_replica_answers_every_sample_once_and_exact_predictions_never_preempt():
    """A pool where vLLM alone preempts (16 samples of 40-400 tokens at most 16 at once in 60 blocks): behind the
    gate, with each sample's true length as its prediction, vLLM never preempts, and every sample (probed ones too:
    the rest waits at the gate) is answered once at its length."""
    rng = np.random.default_rng(4)
    setup = ReplicaSetup(num_blocks=60, max_num_seqs=16, max_num_batched_tokens=512, max_model_len=1024,
                         scheduling_policy="priority")
    cost = StepCostModel(GPUS["h200"], QWEN8)
    requests, want = [], {}
    for g in range(2):
        tokens = prompt_token_ids(f"p{g}", 50, QWEN8.vocab)
        for j in range(8):
            n = int(rng.integers(40, 400))
            want[f"p{g}-{j}"] = n
            if j % 2:
                rest = ReplayRequest(f"p{g}-{j}", (), n - 8, priority=-n, predicted_len=n)
                requests.append(ReplayRequest(f"p{g}-{j}-probe", tokens, 8, priority=-10_000, rest=rest))
            else:
                requests.append(ReplayRequest(f"p{g}-{j}", tokens, n, priority=-n, predicted_len=n))

    def replica(held=False):
        return ReplicaReplay(model_config_dir(QWEN8), setup, cost, QWEN8.vocab, rests_held=held)

    alone = replica().run(requests)
    gated = replay_gated(replica(held=True), requests)
    assert alone.preemptions > 0 and gated.preemptions == 0
    for run in (alone, gated):
        assert sorted(run.finished) == sorted(want.items())
        assert run.probes == 8
    assert gated.peak_kv_blocks <= setup.num_blocks - 1
