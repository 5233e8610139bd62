"""The live decode loop: a batched draft/target speculative decoding engine."""

from specrl.engine.checks import PositionLimit, position_limit
from specrl.engine.engine import SpecEngine
from specrl.engine.stats import Finished, StepStats

__all__ = ["Finished", "PositionLimit", "SpecEngine", "StepStats", "position_limit"]
