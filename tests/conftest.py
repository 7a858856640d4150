"""Shared fixtures. No ``__init__.py`` here: verl's wheel installs a top-level ``tests`` package we must not shadow."""

import os

import numpy as np
import pytest

SHM = "/dev/shm"
LEFT_BEHIND = ("psm_", "sem.mp-")  # torch's shared-memory segments (vLLM's CPU executor), multiprocessing semaphores


def _shm() -> set[str]:
    return set(os.listdir(SHM)) if os.path.isdir(SHM) else set()


@pytest.fixture(scope="session", autouse=True)
def _no_shared_memory_left_behind():
    """Ray ends vLLM's CPU executor and other children without their cleanup, which leaves shared-memory segments
    in /dev/shm; the session removes the ones it created, once every child has ended."""
    before = _shm()
    yield
    for name in _shm() - before:
        if name.startswith(LEFT_BEHIND):
            try:
                os.unlink(os.path.join(SHM, name))
            except OSError:
                pass


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


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The project's tiny Qwen3 checkpoint (built once, cached under .cache/tiny-model/)."""
    from verl_infsample.models.tiny import tiny_model_path

    return str(tiny_model_path())


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir):
    from verl_infsample.engines.transformers_engine import TransformersEngine

    return TransformersEngine.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_prompts(tiny_model_dir):
    """Chat-formatted token ids of held-out prompts, and the stop ids (eos, pad)."""
    from transformers import AutoTokenizer

    from verl_infsample.models.tiny import default_prompts

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                   return_dict=False) for t in default_prompts(6, seed=4242)]
    return ids, (tok.eos_token_id,)
