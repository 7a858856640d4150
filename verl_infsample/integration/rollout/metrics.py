"""The ``infsample/*`` metrics of a server's engine rollouts, and how those of several rollouts combine.

Batches of one server run one after another (times and steps add up); replicas run side by side (the slowest one is
the step's rollout time). Counts always add up.
"""

from __future__ import annotations

_SUM = ("infsample/samples", "infsample/preemptions", "infsample/batches", "infsample/joined", "infsample/total_tokens",
        "infsample/lookahead_prefills", "infsample/tokens_computed", "infsample/cached_prompt_tokens",
        "infsample/probes", "infsample/probe_continuations", "infsample/probe_skipped", "infsample/rests_held",
        "infsample/held_aborted", "infsample/starved_steps",
        "infsample/running_rows",  # running_rows / decode_steps: rows a step, one replica
        "infsample/spec_drafted", "infsample/spec_accepted", "infsample/spec_rows", "infsample/spec_proposing_rows",
        "infsample/spec_from_group", "infsample/spec_group_tree_mb", "infsample/spec_tree_mb")
_SEQUENTIAL = ("infsample/decode_steps", "infsample/lower_bound_steps", "infsample/arrival_bound_steps",
               "infsample/plan_ms",
               "infsample/wall_s")  # sum in a server, max across
_MAX = ("infsample/peak_kv_bytes", "infsample/peak_kv_blocks", "infsample/kv_blocks", "infsample/kv_block_size",
        "infsample/engine_room", "infsample/spec_drafter_ms_per_step", "infsample/spec_law_gap", "infsample/spec_law_z",
        "infsample/spec_law_tested", "infsample/spec_law_alarm",
        "infsample/spec_drafts_halted")  # the largest in magnitude
DRAFTED_AT, ACCEPTED_AT = "infsample/spec_drafted_pos", "infsample/spec_accepted_pos"  # counts by draft position


def rollout_metrics(res, capacity, *, samples: int, joined: int) -> dict:
    """One engine rollout's metrics (``res``: its ``EngineRollout``; ``samples``: every request it decoded, ``joined``
    of which arrived while it decoded)."""
    return {
        "infsample/decode_steps": res.stats.decode_steps, "infsample/peak_kv_bytes": res.kv.peak_in_use_bytes,
        "infsample/preemptions": res.stats.preemptions, "infsample/plan_ms": res.stats.plan_ms,
        "infsample/lookahead_prefills": res.stats.lookahead_prefills, "infsample/samples": samples,
        "infsample/wall_s": res.wall_s, "infsample/joined": joined,
        "infsample/lower_bound_steps": _lower_bound_steps(res, capacity)}


def merge_rollout_metrics(metrics: list[dict], *, parallel: bool) -> dict:
    """Combine ``infsample/*`` metric dicts: of one server's successive batches (``parallel=False``) or of several
    replicas' step totals (``parallel=True``). Keys outside the known ones are dropped; empty dicts are ignored."""
    metrics = [m for m in metrics if m]
    out: dict = {}
    positions = sorted({k for m in metrics for k in m if k.startswith((DRAFTED_AT, ACCEPTED_AT))})
    for key in _SUM + _SEQUENTIAL + _MAX + tuple(positions):
        values = [m[key] for m in metrics if key in m]
        if not values:
            continue
        if key in _MAX:
            out[key] = max(values, key=abs)
        else:
            out[key] = max(values) if parallel and key in _SEQUENTIAL else sum(values)
    if parallel and metrics:
        out["infsample/replicas"] = len(metrics)
        # tokens a running row gained per step: 1 + accepted drafts (vLLM counts the rows running after each step,
        # without those that finished in it: short answers read a little above 1 without drafts)
        if out.get("infsample/running_rows"):
            out["infsample/spec_tokens_per_step"] = out["infsample/total_tokens"] / out["infsample/running_rows"]
        for key in [k for k in out if k.startswith(DRAFTED_AT)]:  # the step's counts -> acceptance by position
            j = key.removeprefix(DRAFTED_AT)
            drafted, accepted = out.pop(key), out.pop(f"{ACCEPTED_AT}{j}", 0)
            if drafted:
                out[f"infsample/spec_acceptance_pos{j}"] = accepted / drafted
    return out


def _lower_bound_steps(res, capacity) -> int:
    """No schedule decodes this batch in fewer steps: max(longest sample, ceil(tokens / M)); under a KV budget,
    the longest sample (the budget's own bound needs the prompts: see ``engines.simulated``)."""
    lengths = [len(o.token_ids) for group in res.outputs for o in group]
    longest = max(lengths, default=0)
    if capacity.slots is not None:
        return max(longest, -(-sum(lengths) // capacity.slots))
    return longest
