"""Drafts in the vLLM server (``custom.speculative``): what they may not change, and what they did.

With any ``speculative_config`` vLLM (0.24 and 0.32) raises on a request with ``min_p`` or ``logit_bias`` and refuses
custom logits processors at start: a request that asks for them is refused here first, by name and with the fix. What
drafts did comes from two places: vLLM's scheduler (drafted and accepted tokens, by position: ``stats``, the same
for every method) and, with ``group``, the drafter in each worker (its own time, where its drafts came from, and
the run-time law check of ``spec.law_guard``), fetched by ``collective_rpc`` (``worker_extension``).
"""

from __future__ import annotations

import logging

from ....spec.law_guard import LawTally

logger = logging.getLogger(__name__)
CHANGED_BY_DRAFTS = {  # sampling parameter -> is it set (vLLM refuses it while drafts are on)
    "min_p": lambda v: v is not None and float(v) > 0,
    "logit_bias": lambda v: bool(v),
    "logits_processors": lambda v: bool(v),
}


def refuse_what_drafts_change(speculative: str, sampling_params: dict) -> None:
    if speculative == "off":
        return
    for key, is_set in CHANGED_BY_DRAFTS.items():
        if is_set(sampling_params.get(key)):
            raise ValueError(f"sampling parameter {key}={sampling_params[key]!r}: vLLM refuses it while drafts "
                             f"are on (actor_rollout_ref.rollout.custom.speculative={speculative!r}); remove it, or "
                             "set custom.speculative=off")


class DraftReport:
    """The drafter's ``infsample/spec_*`` figures for verl's logger, and the alarm when verification moves the law
    (the check accumulates over the run: a small gap becomes visible as tokens add up)."""

    def __init__(self, speculative: str):
        self.speculative = speculative
        self.law = LawTally()
        self.alarmed = False

    async def pop_metrics(self, worker_rpc) -> dict:
        """``worker_rpc(method)``: vLLM's ``collective_rpc`` of the server's engine (called only with drafts on)."""
        if self.speculative != "group":
            return {}
        parts = [p for p in await worker_rpc("infsample_pop_drafter_stats") if p]
        if not parts:
            return {}
        steps = max(p["steps"] for p in parts)
        propose_s = max(p["propose_s"] for p in parts)
        step_law = LawTally()
        for p in parts:
            step_law.merge(LawTally(**p["law"]))
        self.law.merge(step_law)
        out = {"infsample/spec_drafter_ms_per_step": 1e3 * propose_s / max(1, steps),
               "infsample/spec_proposing_rows": sum(p["proposing_rows"] for p in parts),
               "infsample/spec_rows": sum(p["rows"] for p in parts),
               "infsample/spec_from_group": sum(p["from_group"] for p in parts),
               "infsample/spec_group_tree_mb": sum(p["group_bytes"] for p in parts) / 2**20,
               "infsample/spec_tree_mb": sum(p["tree_bytes"] for p in parts) / 2**20,
               "infsample/spec_law_gap": step_law.gap, "infsample/spec_law_z": self.law.z,
               "infsample/spec_law_tested": self.law.tested, "infsample/spec_law_alarm": float(self.law.alarm)}
        if self.law.alarm and not self.alarmed:
            self.alarmed = True
            logger.error("rollout.name=infinite: draft verification moves the sampled law: %d of %d tested draft "
                         "tokens accepted, %.1f expected from their target probabilities (z=%.1f). The rejection "
                         "sampler is not verifying with the requests' own parameters; turn drafts off "
                         "(custom.speculative=off) and report the vLLM build", self.law.accepted, self.law.tested,
                         self.law.expected, self.law.z)
        return out
