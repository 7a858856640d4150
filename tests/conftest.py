"""Shared fixtures. No ``__init__.py`` here: verl's wheel installs a top-level ``tests`` package we must not shadow."""

import os
import shutil
import sys
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings

# Property tests: under CI (``CI`` set) a fixed, derandomized draw, the same on every run, so a red CI is a change
# in the code, never a new draw; elsewhere free exploration. Either way a failure prints its shrunk example and the
# ``@reproduce_failure`` blob that replays it. CI skips shrinking past the first failing example it finds.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow],
                          phases=[Phase.explicit, Phase.generate, Phase.target])
settings.register_profile("explore", print_blob=True, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "explore")


def pytest_configure(config):
    """The run's temporary files go to one folder of its own (``$TMPDIR``, which its workers, Ray, vLLM, torch's
    compile cache and pytest's ``tmp_path`` inherit), removed at the end unless a test failed. Ray ends vLLM's CPU
    executor and other children without their cleanup, which leaves shared-memory segments in /dev/shm; the run
    removes the ones it created (``leftovers``) once every child has ended. With pytest-xdist the
    controller does both, once every worker has ended."""
    config.addinivalue_line("markers", "integration: starts Ray, verl's trainer or an engine, or needs a trained tiny "
                            "model (make test-fast skips)")
    if not hasattr(config, "workerinput"):
        config._infsample_tmp = tempfile.mkdtemp(prefix="infsample-tests-")
        os.environ["TMPDIR"] = config._infsample_tmp
        tempfile.tempdir = None  # gettempdir() reads $TMPDIR again
        import leftovers  # after $TMPDIR: it reads the temporary folder when imported

        config._infsample_leftovers = leftovers.listing()


# What ``make test-fast`` leaves out (``-m "not integration"``): tests that start Ray, verl's trainer, a vLLM
# engine or a decoding engine, or need a trained tiny model (a minute's build), found by the fixtures they use or the
# module they live in. What only loads or decodes a checkpoint, whatever it says, takes ``tiny_checkpoint_dir``.
INTEGRATION_FIXTURES = {"ray_local", "tiny_engine", "tiny_model_dir", "tiny_tools_model_dir", "vllm_model_dir"}
INTEGRATION_MODULES = {"test_grpo_exact", "test_tool_agent", "test_tool_agent_async", "test_vllm_engine",
                       "test_vllm_stats", "test_verl_router", "test_server_sampling", "test_transformers_engine",
                       "test_cpu_platform", "test_predictor_learned"}


# The longest files first (their trainer launches and model builds; ``make test --durations`` shows them), the rest
# in file order: ``make test`` hands files to its workers in this order (``--no-loadscope-reorder``), so the
# longest starts at once and the short ones fill in beside it.
LONGEST_FIRST = ("test_tool_agent", "test_grpo_exact", "test_tool_agent_async", "test_predictor_learned",
                 "test_spec_decode_law", "test_verl_rollout", "test_vllm_engine", "test_replay", "test_scripts",
                 "test_verl_router")


def _module(item) -> str:
    return item.module.__name__.rpartition(".")[2] if item.module else ""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _module(item) in INTEGRATION_MODULES or INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
    rank = {m: i for i, m in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_module(item), len(rank)))


def pytest_unconfigure(config):
    before = getattr(config, "_infsample_leftovers", None)
    if before is not None:
        import leftovers

        leftovers.remove_left_behind(before, wait_s=15.0)
    tmp = getattr(config, "_infsample_tmp", None)
    if tmp is not None and getattr(config, "_infsample_failed", False):  # what a failed test wrote, for its post-mortem
        print(f"\nthe failed run's temporary files are kept in {tmp}", file=sys.stderr)
    elif tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)


def pytest_sessionfinish(session, exitstatus):
    session.config._infsample_failed = exitstatus != 0


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """Tiny models on 2 shared cores run several times faster on one thread (no spin-waiting between ops)."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def drawn_figures(monkeypatch):
    """The matplotlib figures the code under test draws, in order: ``pyplot.close`` is caught so they stay open for
    the test to read their axes (closed at teardown)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    close, figures = plt.close, []
    monkeypatch.setattr(plt, "close", figures.append)
    yield figures
    for fig in figures:
        close(fig)


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The project's tiny Qwen3 checkpoint (built once, cached under .cache/tiny-model/)."""
    from infsample_lab.models.tiny import tiny_model_path

    return str(tiny_model_path())


@pytest.fixture(scope="session")
def tiny_checkpoint_dir(tmp_path_factory):
    """A tiny Qwen3 checkpoint built in seconds (3 training steps): a real Hugging Face folder (config, tokenizer,
    weights) for tests that load or decode one, whatever it says."""
    from infsample_lab.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-checkpoint") / "model", train_steps=3,
                                corpus_size=300))


@pytest.fixture(scope="session")
def tiny_tools_model_dir():
    """The tiny "tools" model, which calls a calculator (built once, cached under .cache/tiny-model-tools/)."""
    from infsample_lab.models.tiny import tiny_model_path

    return str(tiny_model_path(variant="tools"))


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir):
    from verl_infsample.engines.transformers_engine import TransformersEngine

    return TransformersEngine.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_prompts(tiny_model_dir):
    """Chat-formatted token ids of held-out prompts, and the stop ids (eos, pad)."""
    from transformers import AutoTokenizer

    from infsample_lab.models.tiny import default_prompts

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                   return_dict=False) for t in default_prompts(6, seed=4242)]
    return ids, (tok.eos_token_id,)


def _vllm_logit_rules(logits, params, prompt, response) -> list[float]:
    """vLLM's rules on one row of logits, one token at a time in plain Python, as a reference for ours: the logit bias,
    stop tokens banned below min_tokens, the repetition penalty (prompt and response tokens), then frequency and
    presence (response tokens). ``params``: an ``engines.sampling.SamplingParams``."""
    x = [float(v) for v in logits]
    for token, bias in params.logit_bias:
        x[token] += bias
    if len(response) < params.min_tokens:
        for t in params.stop_token_ids:
            x[t] = float("-inf")
    for t in set(prompt) | set(response):
        x[t] = x[t] / params.repetition_penalty if x[t] > 0 else x[t] * params.repetition_penalty
    for t in set(response):
        x[t] -= params.frequency_penalty * response.count(t) + params.presence_penalty
    return x


@pytest.fixture
def vllm_logit_rules():
    return _vllm_logit_rules


@pytest.fixture(scope="module")
def ray_local():
    """Ray started locally for a module's tests (never joining another cluster), shut down after them."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}})
    yield ray
    ray.shutdown()
