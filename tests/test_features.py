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
    bucket_bounds,
    bucket_labels,
    conditional_acceptance,
    drafted_acceptance,
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
        "t = module.AcceptanceTracker(); t.observe(6, 3, 2); print(t.estimate)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0.6180339887498949"  # a + a^2 = 1: the golden ratio - 1


def test_tracker_starts_at_the_first_rate_then_averages_and_ages():
    t = AcceptanceTracker()
    assert (t.estimate, t.staleness, t.last_rate) == (0.0, 1.0, 0.0)
    assert t.since_measured == NEVER_MEASURED  # never measured: due for any probe
    t.observe(8, 4, 1)
    assert (t.estimate, t.since_measured, t.last_rate) == (0.5, 0, 0.5)
    t.observe(8, 8, 4)
    assert t.estimate == pytest.approx(0.5 + ACCEPTANCE_EMA * 0.5)
    for i in range(1, STALE_STEPS + 3):
        t.observe(0, 0, 0)  # K=0: nothing measured, the estimate ages
        assert t.last_rate == 0.0 and t.since_measured == i
    assert t.estimate == pytest.approx(0.625) and t.staleness == 1.0
    t.reset()
    assert (t.estimate, t.staleness, t.measured) == (0.0, 1.0, False)


@pytest.mark.parametrize("k", range(1, 9))
def test_conditional_acceptance_inverts_the_closed_form(k):
    for a in (0.0, 1e-4, 0.1, 0.5, 0.618, 0.9, 0.999, 1.0):
        rate = drafted_acceptance(a, k)
        assert rate == pytest.approx(sum(a**i for i in range(1, k + 1)) / k, abs=1e-15)
        assert conditional_acceptance(rate, k) == pytest.approx(a, abs=1e-9)


def test_the_estimate_does_not_depend_on_k():
    """Rows accepting each draft token with probability 0.7 until the first rejection, as
    the i.i.d. model has it: at every K the estimate reads 0.7, while accepted / drafted
    falls from 0.7 at K=1 to 0.44 at K=4 (``drafted_acceptance``)."""
    import random

    rng = random.Random(0)
    for k in range(1, 5):
        t = AcceptanceTracker()
        estimates, rates = [], []
        for _ in range(2000):
            rows, accepted = 16, 0
            for _ in range(rows):
                n = 0
                while n < k and rng.random() < 0.7:
                    n += 1
                accepted += n
            t.observe(rows * k, accepted, k)
            estimates.append(t.estimate)
            rates.append(t.last_rate)
        assert sum(estimates) / len(estimates) == pytest.approx(0.7, abs=0.01)
        assert sum(rates) / len(rates) == pytest.approx(drafted_acceptance(0.7, k), abs=0.01)
    assert drafted_acceptance(0.7, 4) == pytest.approx(0.4433, abs=1e-4)


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
    assert batch_bucket(0) == "0"
    assert [batch_bucket(b) for b in (129, 256, 257, 512, 513)] == [
        "129-256",
        "129-256",
        "257-512",
        "257-512",
        "513-1024",
    ]
    assert BUCKET_LABELS == ("1", "2-4", "5-8", "9-16", "17-32", "33-64", "65-128")
    assert [bucket_bounds(label) for label in ("1", "65-128", "257-512")] == [
        (1, 1),
        (65, 128),
        (257, 512),
    ]
    assert bucket_labels(["513-1024", "2-4", "129-256", "0"]) == [
        *BUCKET_LABELS,
        "129-256",
        "513-1024",
    ]


def test_step_time_feature_is_a_clipped_log_scale():
    assert step_time_feature(0.0) == 0.0
    assert step_time_feature(1e-4) == pytest.approx(0.0)
    assert step_time_feature(1e-2) == pytest.approx(0.5)
    assert step_time_feature(10.0) == 1.0


# ---------------------------------------------------------------------- mutation gaps


def test_bucket_labels_past_128_rows_go_by_size_not_by_text():
    assert bucket_labels(["1025-2048", "129-256"]) == [*BUCKET_LABELS, "129-256", "1025-2048"]


def test_tracker_stays_never_measured_through_steps_that_draft_nothing():
    t = AcceptanceTracker()
    for _ in range(3):
        t.observe(0, 0, 0)
    assert (t.since_measured, t.staleness, t.measured) == (NEVER_MEASURED, 1.0, False)


def test_step_time_feature_is_0_below_a_tenth_of_a_millisecond():
    assert step_time_feature(1e-5) == 0.0 and step_time_feature(1e-8) == 0.0
