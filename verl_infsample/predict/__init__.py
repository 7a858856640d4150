"""Length prediction that learns the policy online: numpy only, engine-agnostic.

``LearnedPredictor`` (spec ``learned[:k=K,...]``) implements the core's predictor protocol plus the optional hooks
``start_batch``, ``observe_prompt`` and ``observe_tokens``; ``TokenWindow`` is what an engine reports when a sample
reaches a checkpoint.
``make_predictor`` builds any predictor, the core's or this one, from its spec string.
"""

from .features import TokenWindow
from .factory import PREDICTORS, as_predictor, make_predictor
from .learned import LearnedPredictor, checkpoints_up_to, parse_learned_spec

__all__ = ["LearnedPredictor", "PREDICTORS", "TokenWindow", "as_predictor", "checkpoints_up_to", "make_predictor",
           "parse_learned_spec"]
