"""verl custom reward for the logic-puzzle example (knights and knaves).

    reward.custom_reward_function.path=examples/logic_puzzles/reward.py
    reward.custom_reward_function.name=compute_score

``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)`` scores data_source
"knights_knaves" with the rule reward of infsample_lab.tasks.knights_knaves (1.0 when every inhabitant's role after
the final "CONCLUSION:" line is right, 0.1 for a well-formed but wrong answer, else 0.0; ``score`` and
``format_score`` can be set through reward.custom_reward_function.reward_kwargs) and hands any other data source
(e.g. openai/gsm8k) to verl's default_compute_score, so mixed datasets work with this one file.
"""

from infsample_lab.tasks import compute_score

__all__ = ["compute_score"]
