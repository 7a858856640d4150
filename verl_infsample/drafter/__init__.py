"""Several tokens a step: drafts from a sample's group, the prompt's earlier answers and the run, verified by vLLM.

``GroupDrafter`` is what vLLM loads (``speculative_config.method="custom_class"``); ``trees`` holds the drafts'
sources, ``budget`` says how many tokens a row drafts, ``law_guard`` checks at run time that verification keeps
the sampled law. vLLM and arctic-inference are imported only where used.
"""

from .group_drafter import GroupDrafter, pop_drafter_stats

__all__ = ["GroupDrafter", "pop_drafter_stats"]
