"""Model pairs: loading any Hugging Face draft/target pair, and building the offline default.

- :func:`load_pair` loads any target and draft that share a vocabulary (Hub ids or local
  directories).
- :func:`build_pair` builds (or verifies and reuses) the offline pair trained on the Python
  standard library; :func:`load_default_pair` does both.
- :mod:`specrl.models.corpus` holds the corpus split and the held-out evaluation domains.
"""

from specrl.models.build import PRESETS, PairPaths, build_pair
from specrl.models.pair import ModelPair, load_default_pair, load_pair

__all__ = ["PRESETS", "ModelPair", "PairPaths", "build_pair", "load_default_pair", "load_pair"]
