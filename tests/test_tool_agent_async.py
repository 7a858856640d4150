"""verl's tool agent loop on vLLM with probes in verl's asynchronous ``colocate_async`` mode, through verl's trainer
on the CPU (``examples/tools/run_grpo_cpu.sh``, as ``test_tool_agent.py`` runs it; in a file of its own so that the
test workers run it beside that file's runs).

Set INFSAMPLE_SKIP_E2E=1 to skip it.
"""

import pytest
from test_tool_agent import DRAFTS, _check_tool_rounds, _train, e2e


@e2e
@pytest.mark.timeout(1200)
def test_tool_agent_grpo_colocate_async_on_vllm_with_probes(tmp_path, tiny_tools_model_dir):
    """rollout.name=infinite on vLLM, the learned predictor (each turn a 4-token probe and its rest), group drafts,
    the YAML BaseTool, verl's trainer.v1.trainer_mode=colocate_async: verl samples the next batch while the trainer
    works, aborts the rollout at the end of each sampling phase (the servers' abort_all_requests, landing in probes,
    rests and between a trajectory's turns), syncs the weights and resumes. Every trajectory comes back whole (none
    aborted, its tool round in it); step 1's joined responses carry the log-probs the trainer computes, and step 2
    trains on samples drawn with the weights before step 1's update (staleness 1): the asynchronous mode ran."""
    pytest.importorskip("vllm")
    steps = _train(tmp_path / "run", tiny_tools_model_dir, "infinite", "vllm", "class",
                   "trainer.v1.trainer_mode=colocate_async", "actor_rollout_ref.rollout.custom.predictor='learned:k=4'",
                   *DRAFTS)
    _check_tool_rounds(steps, synced=False)
    for m in steps.values():
        assert m["response/aborted_ratio"] == 0 and "timing_s/update_weights" in m
    assert steps[1]["training/off_policy/trajectory_staleness/max"] == 0
    assert steps[1]["training/rollout_probs_diff_max"] < 1e-3  # sampled with the weights the trainer scores with
    assert steps[2]["training/off_policy/trajectory_staleness/max"] == 1
