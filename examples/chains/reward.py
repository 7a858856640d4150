"""verl custom reward for the chain-arithmetic demo: 1.0 for the right final answer, else 0.0.

    reward.custom_reward_function.path=examples/chains/reward.py reward.custom_reward_function.name=compute_score
"""

from infsample_lab.tasks import compute_score

__all__ = ["compute_score"]
