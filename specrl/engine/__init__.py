"""The live decode loop: a batched draft/target speculative decoding engine."""

from specrl.engine.engine import SpecEngine, position_limit
from specrl.engine.stats import Finished, StepStats

__all__ = ["Finished", "SpecEngine", "StepStats", "position_limit"]
