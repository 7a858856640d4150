"""GRPO through verl's tool agent loop on our transformers engine (the YAML tool), and verl's own vLLM rollout
on the same script (``tool_agent_runs``)."""

import pytest
from tool_agent_runs import STEPS_BATCH, STEPS_N, check_tool_rounds, e2e, train


@pytest.fixture(scope="module")
def infinite_run(tmp_path_factory, tiny_tools_model_dir):
    """rollout.name=infinite on its default engine (the transformers engine, on the CPU), the YAML BaseTool."""
    return train(tmp_path_factory.mktemp("infinite") / "run", tiny_tools_model_dir, "infinite", "auto", "class")


@e2e
@pytest.mark.timeout(1200)
def test_tool_agent_grpo_on_the_transformers_engine(infinite_run):
    check_tool_rounds(infinite_run)
    for m in infinite_run.values():
        assert m["infsample/samples"] > STEPS_BATCH * STEPS_N  # our server decoded first and second turns
        assert m["infsample/preemptions"] == 0


@e2e
@pytest.mark.timeout(1200)
def test_verls_own_vllm_rollout_reports_the_same(tmp_path, tiny_tools_model_dir, infinite_run):
    """The baseline, verl's rollout.name=vllm on the same script: it passes the same checks, and reports the same
    metrics (ours add the rollout's infsample/* figures)."""
    pytest.importorskip("vllm")
    baseline = train(tmp_path / "run", tiny_tools_model_dir, "vllm", "auto", "class")
    check_tool_rounds(baseline)
    for k in (1, 2):
        ours = {key for key in infinite_run[k] if not key.startswith("infsample/")}
        assert ours == set(baseline[k]), sorted(ours ^ set(baseline[k]))
