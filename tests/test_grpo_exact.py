"""Exact GRPO end to end: Infinite Sampling trains as whole groups do, through verl's trainer on the CPU (the example
script of ``test_grpo_cpu_e2e.py``, run twice side by side, each with a Ray of its own: about 1.5 minutes on 2
cores). In a file of its own so that the test workers run it beside the other end-to-end runs.

Set INFSAMPLE_SKIP_E2E=1 to skip it.
"""

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_grpo_cpu_e2e import BATCH, ROOT, _train

pytestmark = pytest.mark.skipif(bool(os.environ.get("INFSAMPLE_SKIP_E2E")), reason="INFSAMPLE_SKIP_E2E is set")


def _samples_by_prompt(dump_dir: Path, step: int) -> dict[str, list[tuple[str, float]]]:
    """verl's rollout dump (trainer.rollout_data_dir) of one step: each prompt's (response, score) pairs, sorted (the
    samples of a group are exchangeable: which of verl's n requests carried which sample is the arrival order)."""
    by_prompt: dict[str, list] = {}
    for line in (dump_dir / f"{step}.jsonl").read_text().splitlines():
        row = json.loads(line)
        by_prompt.setdefault(row["input"], []).append((row["output"], row["score"]))
    return {prompt: sorted(samples) for prompt, samples in by_prompt.items()}


EXACT_N = 16
KV_BUDGET = 1400  # tokens: two ~420-token prompts and 8 worst-case samples between them (a group needs 1456)


@pytest.mark.timeout(1200)
def test_infinite_sampling_trains_exactly_as_whole_groups(tmp_path, tiny_model_dir):
    """The method's claim, through verl's trainer: the same seed gives the same samples and the same GRPO step,
    whether each group decodes whole (``custom.policy=full``) or by Infinite Sampling under a KV budget that holds a
    fraction of a group (micro groups of both groups at once, continuous refill, the plan on learned predictions, so
    samples start in another order than their index), for two steps (the second sampled with the weights the first
    trained). A sample's random stream is keyed by (seed, step, prompt, index), never by where the schedule put it:
    keyed by its admission order instead, the samples differ. Rewards are response lengths (``length_reward.py``), so
    advantages, loss and gradient are not zero."""
    reward = [f"reward.custom_reward_function.path={ROOT / 'tests' / 'length_reward.py'}",
              "reward.custom_reward_function.name=compute_score"]
    whole = [f"actor_rollout_ref.rollout.custom.slots={BATCH * EXACT_N}"]  # every group at once
    # Infinite Sampling in full: a KV budget, the token-conditioned predictor with its first-token lookahead, the plan
    budget = ["actor_rollout_ref.rollout.custom.slots=null", f"actor_rollout_ref.rollout.custom.kv_budget={KV_BUDGET}",
              "actor_rollout_ref.rollout.custom.predictor=learned"]
    together = "actor_rollout_ref.rollout.custom.batch_window_ms=3000"  # a step's requests planned as one batch

    def train(policy, capacity):
        work = tmp_path / policy
        work.mkdir()
        return _train(work / "run", tiny_model_dir, "infinite", "auto", EXACT_N, *reward, *capacity, together,
                      f"actor_rollout_ref.rollout.custom.policy={policy}", f"trainer.rollout_data_dir={work / 'dump'}")

    # the two runs side by side: each waits on its Ray actors' start-up for much of its time
    with ThreadPoolExecutor(2) as pool:
        runs = dict(zip(("full", "infinite"), pool.map(train, ("full", "infinite"), (whole, budget))))
    full, ours = runs["full"], runs["infinite"]
    for k in (1, 2):
        samples = _samples_by_prompt(tmp_path / "full" / "dump", k)
        assert len(samples) == BATCH and all(len(v) == EXACT_N for v in samples.values())
        assert _samples_by_prompt(tmp_path / "infinite" / "dump", k) == samples, f"step {k}: other samples"
        assert len({score for v in samples.values() for _, score in v}) > 1  # rewards differ: GRPO has a signal
        for key in ("critic/score/mean", "critic/rewards/mean", "critic/advantages/mean", "critic/advantages/max",
                    "critic/advantages/min", "response_length/mean", "actor/pg_loss", "actor/grad_norm",
                    "actor/kl_loss", "actor/entropy"):
            assert ours[k][key] == pytest.approx(full[k][key], rel=1e-4, abs=1e-6), (k, key)
    assert full[1]["actor/grad_norm"] > 0 and full[1]["critic/advantages/max"] > 0
    # ... while the two rollouts were scheduled differently: one whole group at a time, against micro groups of both
    # groups at once within the budget
    config = json.loads((Path(tiny_model_dir) / "config.json").read_text())
    kv_bytes_per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * 4
    for k in (1, 2):
        assert ours[k]["infsample/samples"] == full[k]["infsample/samples"] == BATCH * EXACT_N
        assert ours[k]["infsample/batches"] == 1  # both groups in one plan
        assert ours[k]["infsample/peak_kv_bytes"] <= KV_BUDGET * kv_bytes_per_token
        assert ours[k]["infsample/decode_steps"] != full[k]["infsample/decode_steps"]
    for metrics in (ours[1], ours[2]):  # the infinite run's own figures, collected by the infinite_sync trainer
        assert metrics["infsample/replicas"] == 1 and metrics["infsample/seqlen_balance_vs_kk"] <= 1.0
    assert ours[2]["training/rollout_probs_diff_max"] < 1e-3  # step 2 sampled with the weights step 1 trained
