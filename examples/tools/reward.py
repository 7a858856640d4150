"""verl custom reward for the tool agent's arithmetic: 1.0 when the answer after the calculator call is right.

    reward.custom_reward_function.path=examples/tools/reward.py reward.custom_reward_function.name=compute_score
"""

from infsample_lab.tasks import compute_score

__all__ = ["compute_score"]
