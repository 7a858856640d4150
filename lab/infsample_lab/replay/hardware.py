"""What a GPU step costs: datasheet GPUs, published model shapes, and a per-step cost model with its knobs in one
place.

A decode step on a memory-bound GPU reads the weights once and every scheduled row's KV, and pays for each token it
computes on top of that; a big prefill chunk is compute-bound. :class:`StepCostModel` charges a step

    max(FLOPs / (peak * flop_efficiency),
        bytes read / (bandwidth * bandwidth_efficiency) + token FLOPs / (peak * token_flop_efficiency))
    + step_overhead_s

where the token FLOPs are the batched tokens' weight GEMMs (and the LM head at each row that samples): the
per-token term scales with the model's size. The efficiencies and the overhead are a :class:`Calibration`,
fitted to published GPU figures (``published_gpu_steps.json``; ``python -m infsample_lab.replay.calibration``
prints model against figure, ``docs/step_model.md``), printed with every result, replaceable from a JSON file
(``--calibration``) once a GPU run has measured them. Seconds from this model are always labelled modeled; steps,
tokens and preemptions come from vLLM's own scheduler.

The engine's host time (scheduling, bookkeeping, and with drafts the proposer) is charged as vLLM 0.32 runs it:
with drafts off, async scheduling overlaps it with the GPU step (a step lasts the longer of the two); with
``ngram``, ``suffix`` or a ``custom_class`` drafter vLLM turns async scheduling off, so it adds to the step. A
device-resident drafter (``group_gpu``, modeled: it does not ship) keeps the overlap, as ``ngram_gpu`` does, and adds
its kernel's time to the GPU's: the larger of the reads it makes over the bandwidth and a published share of the step
(:attr:`Calibration.device_draft_share`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

GIB = 1 << 30
ASYNC_DRAFTERS = ("group_gpu",)  # drafters whose drafting runs on the device: vLLM keeps async scheduling


@dataclass(frozen=True)
class GPU:
    """Datasheet figures of one GPU (SXM parts): memory, HBM bandwidth, dense bf16 tensor FLOP/s (no sparsity)."""

    name: str
    memory_bytes: float
    hbm_bytes_per_s: float
    bf16_flops: float
    source: str


GPUS = {
    "h100": GPU("h100", 80e9, 3.35e12, 989e12, "NVIDIA H100 SXM5 datasheet: 80 GB HBM3, 3.35 TB/s, 989 TFLOPS bf16 dense"),
    "h200": GPU("h200", 141e9, 4.8e12, 989e12, "NVIDIA H200 SXM datasheet: 141 GB HBM3e, 4.8 TB/s, 989 TFLOPS bf16 dense"),
    "a100": GPU("a100", 80e9, 2.039e12, 312e12,
                "NVIDIA A100 80GB SXM datasheet: 80 GB HBM2e, 2,039 GB/s, 312 TFLOPS bf16 dense"),
}


@dataclass(frozen=True)
class ModelShape:
    """A decoder's shape as its Hugging Face ``config.json`` publishes it (bf16 weights and KV)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    max_position_embeddings: int
    dtype_bytes: int = 2

    @property
    def layer_params(self) -> int:
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)  # q, o and k, v projections
        return attn + 3 * self.hidden * self.intermediate  # gate, up, down

    @property
    def params(self) -> int:
        """Every weight: the layers, the embedding and (untied) the LM head."""
        embed = self.vocab * self.hidden
        return self.layers * self.layer_params + embed * (1 if self.tied_embeddings else 2)

    @property
    def weights_read_per_step(self) -> int:
        """Bytes a forward pass reads: every weight but the embedding table (a lookup), the LM head included."""
        return (self.layers * self.layer_params + self.vocab * self.hidden) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def hf_config(self) -> dict:
        """A ``config.json`` vLLM reads to build its model config (no weights are ever loaded)."""
        return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": self.hidden,
                "intermediate_size": self.intermediate, "num_hidden_layers": self.layers,
                "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
                "max_position_embeddings": self.max_position_embeddings, "vocab_size": self.vocab,
                "tie_word_embeddings": self.tied_embeddings, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
                "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False,
                "bos_token_id": min(151643, self.vocab - 2), "eos_token_id": min(151645, self.vocab - 1)}


# Qwen/Qwen3-*/config.json on the Hugging Face hub, and one Llama
MODELS = {
    "qwen3-1.7b": ModelShape("qwen3-1.7b", 28, 2048, 6144, 16, 8, 128, 151936, True, 40960),
    "qwen3-8b": ModelShape("qwen3-8b", 36, 4096, 12288, 32, 8, 128, 151936, False, 40960),
    "qwen3-32b": ModelShape("qwen3-32b", 64, 5120, 25600, 64, 8, 128, 151936, False, 40960),
    # meta-llama/Llama-3.1-8B/config.json: the model of the published step figures (``published_gpu_steps.json``)
    "llama-3.1-8b": ModelShape("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128, 128256, False, 131072),
    # the shape of the lab's tiny Qwen3 (``infsample_lab.models``): what the CPU runs (the GPU check's dry run)
    "qwen3-tiny": ModelShape("qwen3-tiny", 2, 128, 128, 2, 1, 64, 1024, True, 4096),
}


@dataclass(frozen=True)
class Calibration:
    """The cost model's free parameters. ``bandwidth_efficiency``, ``token_flop_efficiency`` and
    ``step_overhead_s`` are fitted to published GPU step figures (Llama-3.1-8B on H100 and H200:
    ``published_gpu_steps.json``, ``infsample_lab.replay.calibration.fit``); ``flop_efficiency`` binds only
    compute-bound steps, which no published figure covers; the host fields are measured on a CPU
    (``infsample replay-host``). A GPU run's own fit replaces them (``--calibration``)."""

    flop_efficiency: float = 0.6  # share of the dense bf16 peak a compute-bound step (a big prefill chunk) reaches
    # share of the HBM bandwidth that weight and KV reads reach (the fit meets its bound of 1; the H100 points
    # alone give 0.997)
    bandwidth_efficiency: float = 1.0
    # what a step pays each batched token beyond the reads: its weight GEMMs (and LM head where it samples) at
    # this share of the bf16 peak (20 us a token for Llama-3.1-8B on H100 or H200)
    token_flop_efficiency: float = 0.75
    step_overhead_s: float = 0.0027  # per step on the GPU's side: sampling, kernel launches, TP all-reduces
    activation_bytes_per_batched_token: float = 0.0  # 0: estimated from the model shape (see ``kv_pool_blocks``)
    reserved_bytes: float = 2 * GIB  # CUDA context, graphs and allocator slack vLLM does not give to KV
    # the engine's host time per step, a fixed part and a part per scheduled row (vLLM's scheduler calls), and each
    # drafter's time (proposing, and reading the verdicts): per row it is called for (vLLM calls it for every
    # decoding row, every step) and per row it drafts for (vLLM's own proposers draft on every row they are called
    # for, so theirs is all the latter): `infsample replay-host` on a 2-core CPU (game of 24 text, 256 rows; the
    # drafters' figures the median of three runs); a GPU host's own figures replace them
    host_step_s: float = 1.2e-5
    host_row_s: float = 1.36e-5
    propose_ngram_row_s: float = 2.4e-6
    propose_suffix_row_s: float = 1.23e-5
    propose_group_row_s: float = 1.27e-5
    upkeep_ngram_row_s: float = 0.0
    upkeep_suffix_row_s: float = 0.0
    upkeep_group_row_s: float = 4.4e-6
    # a device drafter's kernel, at least this share of the step's GPU time (SpecDecode-Bench, arXiv 2601.11580:
    # n-gram drafting is 0.59% of the verify time, H100, Llama-3.1-8B)
    device_draft_share: float = 0.0059

    @classmethod
    def from_file(cls, path: str | Path) -> "Calibration":
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"--calibration {path}: cannot read it as JSON ({e})") from None
        known = {f.name for f in fields(cls)}
        if not isinstance(raw, dict) or set(raw) - known:
            bad = sorted(set(raw) - known) if isinstance(raw, dict) else [type(raw).__name__]
            raise ValueError(f"--calibration {path}: unknown key(s) {bad}; known: {', '.join(sorted(known))}")
        c = cls(**raw)
        for f in fields(cls):
            v = getattr(c, f.name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or not math.isfinite(v):
                raise ValueError(f"--calibration {path}: {f.name}={v!r} must be a finite number >= 0")
        if not all(0 < e <= 1 for e in (c.flop_efficiency, c.bandwidth_efficiency, c.token_flop_efficiency)):
            raise ValueError(f"--calibration {path}: efficiencies must be in (0, 1]")
        return c

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class StepCostModel:
    """Seconds of one engine step of ``model`` on ``tp`` GPUs of ``gpu`` (modeled)."""

    gpu: GPU
    model: ModelShape
    tp: int = 1
    calibration: Calibration = Calibration()

    def _terms(self, tokens, attended, kv_tokens, sampling_rows):
        """A step's three times at full efficiency on one of its ``tp`` GPUs (numbers or arrays of steps): its
        FLOPs over the peak, its bytes over the bandwidth, and its tokens' weight and LM-head FLOPs over the peak.
        ``tokens``: tokens computed; ``attended``: (query, key) pairs of attention; ``kv_tokens``: KV tokens read
        and written; ``sampling_rows``: positions whose LM head runs."""
        m = self.model
        token_flops = 2 * m.layers * m.layer_params * tokens + 2 * m.vocab * m.hidden * sampling_rows
        flops = token_flops + 4 * m.layers * m.heads * m.head_dim * attended
        bytes_ = m.weights_read_per_step + kv_tokens * m.kv_bytes_per_token
        peak, bw = self.gpu.bf16_flops * self.tp, self.gpu.hbm_bytes_per_s * self.tp
        return flops / peak, bytes_ / bw, token_flops / peak

    def terms(self, new_tokens: np.ndarray, contexts: np.ndarray, sampling_rows: int) -> tuple[float, float, float]:
        """The step of :meth:`seconds` as its three times at full efficiency and no overhead: compute (FLOPs over
        the peak), reads (bytes over the bandwidth), tokens (the batched tokens' GEMM FLOPs over the peak)."""
        t = float(np.sum(new_tokens))
        # attention: each new token attends to its context and the new tokens before it
        attended = float(np.sum(new_tokens * contexts + new_tokens * (new_tokens + 1) / 2))
        kv_tokens = float(np.sum(contexts + new_tokens)) + t  # read (context and new), and the new tokens written
        return self._terms(t, attended, kv_tokens, sampling_rows)

    def _combine(self, compute, read, tokens):
        c = self.calibration
        return np.maximum(compute / c.flop_efficiency,
                          read / c.bandwidth_efficiency + tokens / c.token_flop_efficiency) + c.step_overhead_s

    def seconds(self, new_tokens: np.ndarray, contexts: np.ndarray, sampling_rows: int) -> float:
        """A step that computes ``new_tokens[i]`` tokens of row i on top of ``contexts[i]`` cached ones;
        ``sampling_rows`` rows produce a token (their LM head runs): the larger of the compute roofline and the
        reads plus the tokens' cost, plus the step overhead (the module docstring)."""
        return float(self._combine(*self.terms(new_tokens, contexts, sampling_rows)))

    def verify_token_seconds(self) -> float:
        """What one more verified token adds to a step below the compute roofline: its GEMMs and LM head at the
        token efficiency (the drafts' budget weighs draft tokens by it)."""
        return float(self._terms(1.0, 0.0, 0.0, 1.0)[2] / self.calibration.token_flop_efficiency)

    def host_seconds(self, rows: int) -> float:
        """The engine's host time for a step of ``rows`` scheduled rows, drafting aside."""
        return self.calibration.host_step_s + self.calibration.host_row_s * rows

    def propose_seconds(self, drafter: str, called: int, drafting: int) -> float:
        """``drafter``'s host time (``ngram``, ``suffix`` or ``group``; none for a device drafter) called for
        ``called`` decoding rows, drafting for ``drafting`` of them."""
        if drafter in ASYNC_DRAFTERS:
            return 0.0
        c = self.calibration
        return getattr(c, f"upkeep_{drafter}_row_s") * called + getattr(c, f"propose_{drafter}_row_s") * drafting

    def device_draft_seconds(self, gpu_s: float, scanned_tokens: int) -> float:
        """A device drafter's kernel in a step of GPU time ``gpu_s`` that read ``scanned_tokens`` token ids (int32)
        of its sources: the reads over the bandwidth, at least the published share of the step."""
        c = self.calibration
        reads = 4 * scanned_tokens / (self.gpu.hbm_bytes_per_s * self.tp * c.bandwidth_efficiency)
        return max(reads, c.device_draft_share * gpu_s)

    def step_seconds(self, gpu_s: float, rows: int, drafter: str | None = None, called: int = 0,
                     drafting: int = 0, device_s: float = 0.0) -> float:
        """A whole engine step: its GPU time ``gpu_s`` (:meth:`seconds`) and its host time, overlapped (drafts off,
        or a device drafter whose kernel took ``device_s``: async scheduling) or added to it with the proposer's
        (``drafter``: vLLM schedules synchronously)."""
        host = self.host_seconds(rows)
        if drafter is None or drafter in ASYNC_DRAFTERS:
            return max(gpu_s + device_s, host)
        return gpu_s + host + self.propose_seconds(drafter, called, drafting)

    def decode_run_seconds(self, contexts: np.ndarray, steps: int, kv_tokens_read: float | None = None,
                           synchronous: bool = False) -> float:
        """``steps`` decode steps of the same rows, each row one token a step, row i starting at ``contexts[i]``,
        drafts off: the sum of :meth:`step_seconds` over them, in closed form per step. ``kv_tokens_read``: the KV
        tokens the first of them reads, where rows share some (an engine that reads a group's prompt once for all
        its samples); default: every row its own context. ``synchronous``: as vLLM runs them with the group drafter
        drafting nothing (the host's time and the drafter's upkeep added to each step)."""
        if steps <= 0:
            return 0.0
        rows = len(contexts)
        j = np.arange(steps, dtype=float)
        base = float(np.sum(contexts))
        read = base if kv_tokens_read is None else float(kv_tokens_read)
        attended = base + rows * j + rows  # each row: context + j, plus itself
        kv_tokens = read + rows * j + rows + rows  # read (context + j, and the new token), the new token written
        per_step = self._combine(*self._terms(float(rows), attended, kv_tokens, rows))
        if synchronous:
            return float(np.sum(per_step) + steps * self.step_seconds(0.0, rows, "group", rows, 0))
        return float(np.sum(np.maximum(per_step, self.host_seconds(rows))))

    def kv_pool_blocks(self, gpu_memory_utilization: float, block_size: int, max_num_batched_tokens: int,
                       max_num_seqs: int) -> int:
        """The KV blocks vLLM would give one replica: ``gpu_memory_utilization`` of each GPU's memory less the
        weights' shard, the profiled activation peak (``max_num_batched_tokens`` tokens through the widest layer,
        the sampler's logits for ``max_num_seqs`` rows) and a reserve, split into blocks of the KV shard."""
        m, c = self.model, self.calibration
        per_token = c.activation_bytes_per_batched_token or (4 * m.hidden + 2 * m.intermediate) * m.dtype_bytes
        activations = max_num_batched_tokens * per_token + 2 * max_num_seqs * m.vocab * 4
        free = (self.gpu.memory_bytes * gpu_memory_utilization - m.params * m.dtype_bytes / self.tp
                - activations - c.reserved_bytes)
        return max(0, int(free // (block_size * m.kv_bytes_per_token / self.tp)))

    def describe(self) -> dict:
        return {"gpu": self.gpu.name, "model": self.model.name, "tp": self.tp, "gpu_source": self.gpu.source,
                "calibration": self.calibration.as_dict(), "seconds": "modeled"}
