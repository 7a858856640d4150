"""Length prediction that learns the policy online: numpy only, engine-agnostic.

``LearnedPredictor`` (spec ``learned[:k=K,...]``) implements the core's predictor protocol plus the optional hooks
``start_batch``, ``observe_prompt`` and ``observe_tokens``; ``TokenWindow`` is what an engine reports when a sample
reaches a checkpoint.
``evaluate`` holds ``infsample eval-predictor`` (imports torch lazily, only for model rollouts).
"""

from .features import TokenWindow
from .learned import LearnedPredictor, checkpoints_up_to, parse_learned_spec

__all__ = ["LearnedPredictor", "TokenWindow", "checkpoints_up_to", "parse_learned_spec"]
