"""A sample decoded as two vLLM requests, its probe and its rest, answered as one response.

The probe decodes the sample's first ``k`` tokens; the rest continues from the prompt plus those tokens (vLLM's
prefix cache holds the prompt's blocks and the probe's full ones, so only the probe's last partial block is
prefilled again). verl sees one response: the tokens and log-probs of both, the stop reason of the last, the
preemptions of both.

The split must not change what is sampled, so a request is probed only when every sampling parameter it carries
means the same for the rest as for the whole: per-token parameters (temperature, top-p/k, min-p, logit bias),
repetition penalty (vLLM applies it over the prompt and the output alike), token-level stops and ``min_tokens``
(carried over, less the probe's tokens). A parameter that reads the output so far as output (presence and frequency
penalties, stop strings, bad words), a request seed (its stream would restart), structured output, multimodal
input or a disaggregated prefill runs the request whole: :func:`probe_refusal` says why.
"""

from __future__ import annotations

from typing import Any

PROBE_SUFFIX = "-probe"  # a probe's request id: its sample's, with this suffix
# sampling parameters whose meaning does not depend on where the output starts
SPLITTABLE = frozenset({"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "logprobs", "max_tokens",
                        "max_new_tokens", "min_tokens", "stop_token_ids", "ignore_eos", "logit_bias",
                        "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
                        "detokenize"})
ZERO_MEANS_OFF = ("presence_penalty", "frequency_penalty")


def probe_refusal(sampling_params: dict[str, Any], *, multimodal: bool = False, seeded: bool = False,
                  routed_experts: bool = False, kv_transfer: bool = False) -> str | None:
    """Why a request with these parameters runs whole rather than probed (None: it can be probed)."""
    if multimodal:
        return "multimodal input"
    if seeded or sampling_params.get("seed") is not None:
        return "seed"
    if routed_experts:
        return "rollout routing replay"
    if kv_transfer:
        return "kv transfer"
    for key, value in sampling_params.items():
        if key in SPLITTABLE:
            continue
        if key in ZERO_MEANS_OFF and not value:
            continue
        if key in ("stop", "bad_words") and not value:
            continue
        return key
    return None


def split_params(sampling_params: dict[str, Any], total_tokens: int, probe_tokens: int
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The probe's and the rest's parameters for a request of ``total_tokens`` at most (> ``probe_tokens``)."""
    params = {k: v for k, v in sampling_params.items() if k not in ("max_tokens", "max_new_tokens")}
    min_tokens = int(params.pop("min_tokens", 0) or 0)
    probe = {**params, "max_tokens": probe_tokens}
    rest = {**params, "max_tokens": total_tokens - probe_tokens}
    if min_tokens:
        probe["min_tokens"] = min(min_tokens, probe_tokens)
        if min_tokens > probe_tokens:
            rest["min_tokens"] = min_tokens - probe_tokens
    return probe, rest


def join(probe, rest):
    """One ``TokenOutput`` for the sample: ``probe``'s tokens then ``rest``'s (verl's ``TokenOutput``s)."""
    log_probs = None
    if probe.log_probs is not None and rest.log_probs is not None:
        log_probs = list(probe.log_probs) + list(rest.log_probs)
    preempted = None
    if probe.num_preempted is not None or rest.num_preempted is not None:
        preempted = (probe.num_preempted or 0) + (rest.num_preempted or 0)
    extra = dict(rest.extra_fields)
    if "num_cached_tokens" in probe.extra_fields:  # the prompt's cache hits are the probe's
        extra["num_cached_tokens"] = probe.extra_fields["num_cached_tokens"]
    return rest.model_copy(update={"token_ids": list(probe.token_ids) + list(rest.token_ids), "log_probs": log_probs,
                                   "num_preempted": preempted, "extra_fields": extra})
