"""Shared fixtures. ``micro_pair`` is the offline micro pair, built once per test session."""

from __future__ import annotations

import pytest
import torch

# The test models are tiny: intra-op threads buy nothing and, when anything else runs on a
# 2-core machine, two spinning OpenMP threads make each step over 100x slower.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def micro_pair_paths(tmp_path_factory):
    """The micro pair built into a session-private SPECRL_HOME (about 10 s on 2 cores)."""
    from specrl.models import build_pair

    home = tmp_path_factory.mktemp("specrl_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECRL_HOME", str(home))
        paths = build_pair("micro", progress=False)
    return paths


@pytest.fixture(scope="session")
def micro_pair(micro_pair_paths):
    """The micro ``ModelPair`` (float32, CPU, eval mode). Share it; do not modify it."""
    from specrl.models import load_pair

    return load_pair(micro_pair_paths.target_path, micro_pair_paths.draft_path)
