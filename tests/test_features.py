"""The observation's features: one pure-Python module that the envs and policies share."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specrl.features import (
    ACCEPTANCE_EMA,
    BUCKET_LABELS,
    NEVER_MEASURED,
    STALE_STEPS,
    AcceptanceTracker,
    batch_bucket,
    step_time_feature,
)


def test_features_module_imports_no_numpy_torch_or_gymnasium():
    """Loaded on its own (as a serving stack would vendor it), with those modules blocked."""
    import specrl.features as features

    code = (
        "import sys, importlib.util\n"
        "for name in ('numpy', 'torch', 'gymnasium', 'stable_baselines3'):\n"
        "    sys.modules[name] = None\n"
        f"spec = importlib.util.spec_from_file_location('features', {features.__file__!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "t = module.AcceptanceTracker(); t.observe(4, 3); print(t.estimate)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0.75"


def test_tracker_starts_at_the_first_rate_then_averages_and_ages():
    t = AcceptanceTracker()
    assert (t.estimate, t.staleness, t.last_rate) == (0.0, 1.0, 0.0)
    assert t.since_measured == NEVER_MEASURED  # never measured: due for any probe
    t.observe(8, 4)
    assert (t.estimate, t.since_measured, t.last_rate) == (0.5, 0, 0.5)
    t.observe(8, 8)
    assert t.estimate == pytest.approx(0.5 + ACCEPTANCE_EMA * 0.5)
    for i in range(1, STALE_STEPS + 3):
        t.observe(0, 0)  # K=0: nothing measured, the estimate ages
        assert t.last_rate == 0.0 and t.since_measured == i
    assert t.estimate == pytest.approx(0.625) and t.staleness == 1.0
    t.reset()
    assert (t.estimate, t.staleness, t.measured) == (0.0, 1.0, False)


def test_batch_buckets_cover_1_to_128():
    assert [batch_bucket(b) for b in (1, 2, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 128)] == [
        "1",
        "2-4",
        "2-4",
        "5-8",
        "5-8",
        "9-16",
        "9-16",
        "17-32",
        "17-32",
        "33-64",
        "33-64",
        "65-128",
        "65-128",
    ]
    assert batch_bucket(129) == ">128" and batch_bucket(0) == "0"
    assert BUCKET_LABELS == ("1", "2-4", "5-8", "9-16", "17-32", "33-64", "65-128")


def test_step_time_feature_is_a_clipped_log_scale():
    assert step_time_feature(0.0) == 0.0
    assert step_time_feature(1e-4) == pytest.approx(0.0)
    assert step_time_feature(1e-2) == pytest.approx(0.5)
    assert step_time_feature(10.0) == 1.0
