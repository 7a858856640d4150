"""What a rollout server takes from verl, on either engine: how many calls at once, and (the transformers engine) a
request's sampling parameters.

Every parameter the engine honours keeps vLLM's meaning (``engines.sampling``); any other key, and every bad value,
is refused by name, never dropped, so a request the engine cannot decode as asked fails alone and says why.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...engines.sampling import SamplingParams

FINISHED_LENGTHS_KEPT = 1 << 16  # (prompt key, length) pairs kept for a router to collect (pop_finished_lengths)
REQUESTS_IN_FLIGHT = 1 << 16
"""Calls a rollout server takes at once. verl's agent loop sends every sample of a step as its own call and each
waits until its sample is decoded, so a step has n x prompts calls in flight (64 x 512 = 32768); a call past the actor's
limit would wait in Ray, unseen by the plan (verl's own replicas allow 1000)."""

HONOURED_KEYS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "max_new_tokens", "min_tokens", "logprobs",
                 "stop_token_ids", "ignore_eos", "seed", "repetition_penalty", "presence_penalty", "frequency_penalty",
                 "logit_bias")
LOGIT_BIAS_LIMIT = 100.0  # vLLM clamps a logit bias to [-100, 100]


@dataclass(frozen=True)
class RolloutDefaults:
    """What a request that does not say takes from verl's rollout config, as verl's vLLM server does."""

    ignore_eos: bool = False  # rollout.ignore_eos
    repetition_penalty: float = 1.0  # rollout.repetition_penalty
    seed: int | None = None  # rollout.seed + the replica's rank with rollout.full_determinism, else none


def request_sampling(sampling_params: dict, request_id: str, *, max_new_tokens: int, eos: tuple[int, ...],
                     vocab_size: int, defaults: RolloutDefaults) -> tuple[SamplingParams, int | None]:
    """A request's sampling parameters as the engine takes them (with ``max_new_tokens``, its response cap, and seed 0)
    and its own seed (None: the rollout's). Every key the engine cannot honour, and every bad value, is refused by
    name: the error fails this request alone."""
    def refuse(why: str) -> ValueError:
        return ValueError(f"request {request_id}: {why}")

    if unknown := sorted(k for k, v in sampling_params.items() if k not in HONOURED_KEYS and v is not None):
        raise refuse(f"sampling parameter {unknown[0]!r} is not supported by the transformers engine (it honours "
                     f"{', '.join(HONOURED_KEYS)}); drop it, or decode with actor_rollout_ref.rollout.custom."
                     "engine=vllm (verl's vLLM server, which takes every vLLM sampling parameter)")
    sp = {k: v for k, v in sampling_params.items() if v is not None}
    try:
        for key in ("stop_token_ids", "logit_bias"):
            if bad := [int(t) for t in (sp.get(key) or ()) if not 0 <= int(t) < vocab_size]:
                raise ValueError(f"{key} names token {bad[0]}, outside the model's vocabulary of {vocab_size}")
        bias = tuple(sorted((int(t), min(max(float(b), -LOGIT_BIAS_LIMIT), LOGIT_BIAS_LIMIT))
                            for t, b in (sp.get("logit_bias") or {}).items()))
        ignore_eos = bool(sp.get("ignore_eos", defaults.ignore_eos))
        stops = tuple(sorted({*(() if ignore_eos else eos), *(int(t) for t in sp.get("stop_token_ids") or ())}))
        seed = sp.get("seed", defaults.seed)
        params = SamplingParams(
            temperature=float(sp.get("temperature", 1.0)), top_p=float(sp.get("top_p", 1.0)),
            top_k=int(sp.get("top_k", -1)), min_p=float(sp.get("min_p", 0.0)), max_new_tokens=max_new_tokens,
            min_tokens=int(sp.get("min_tokens", 0)), stop_token_ids=stops, logit_bias=bias,
            repetition_penalty=float(sp.get("repetition_penalty", defaults.repetition_penalty)),
            presence_penalty=float(sp.get("presence_penalty", 0.0)),
            frequency_penalty=float(sp.get("frequency_penalty", 0.0)))
        return params, int(seed) if seed is not None else None
    except (TypeError, ValueError) as e:
        raise refuse(str(e)) from None


def response_cap(prompt_tokens: int, sampling_params: dict, request_id: str, *, max_model_len: int,
                 prompt_length: int, response_length: int) -> int:
    """The most tokens a request's response may have, as verl's vLLM server reckons it: its ``max_tokens`` (or
    ``max_new_tokens``), else what rollout.prompt_length + response_length leave after the prompt, at least 1 and
    within the model's context (``max_model_len``); past rollout.response_length a request is refused (verl's batch
    holds no more)."""
    room = max_model_len - prompt_tokens
    if room < 1:
        raise ValueError(f"request {request_id}: prompt of {prompt_tokens} tokens leaves no room for a response in "
                         f"the model's context of {max_model_len} tokens (actor_rollout_ref.rollout."
                         "max_model_len, else the model's max_position_embeddings); shorten the prompt")
    cap = min(response_length, prompt_length + response_length - prompt_tokens)
    for key in ("max_tokens", "max_new_tokens"):  # verl's vLLM server takes either, max_tokens first
        if sampling_params.get(key) is not None:
            cap = int(sampling_params[key])
            if cap > response_length:
                raise ValueError(f"request {request_id}: {key}={cap} exceeds actor_rollout_ref.rollout."
                                 f"response_length={response_length}; lower it or raise response_length")
            break
    return max(1, min(cap, room))
