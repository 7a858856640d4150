"""The group drafter: several tokens a step, drafted from a sample's group, the prompt's earlier answers and the
run's text, verified by vLLM's rejection sampler.

``vllm_adapter.GroupDrafter`` is what vLLM loads (``speculative_config.method="custom_class"``) and the one module
that touches vLLM. The rest knows none of vLLM's types: ``hints`` (what the server tells the drafter of each
request), ``drafting`` (a step's drafts and what the verdicts teach), ``trees`` (the drafts' sources),
``source_choice`` (which source a row takes), ``budget`` (how many tokens a row drafts) and ``law_guard`` (the
run-time check that verification keeps the sampled law). vLLM and arctic-inference are imported only where used.
"""

from .vllm_adapter import GroupDrafter, halt_drafter, pop_drafter_stats

__all__ = ["GroupDrafter", "halt_drafter", "pop_drafter_stats"]
