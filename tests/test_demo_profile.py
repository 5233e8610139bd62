"""The demo's choice of profile (fast; the end-to-end demo tests are in test_demo.py,
marked slow)."""

from __future__ import annotations

from specrl.demo import DemoOptions


def test_the_demo_matches_a_profile_at_the_thread_count_it_will_run_at(
    micro_pair, tmp_path, monkeypatch
):
    """The demo runs at the profile's thread count, so a one-thread profile must not warn
    "threads differ" while torch still sits at another count; --threads 2 still warns."""
    import warnings

    import torch

    import specrl.envs
    from specrl.demo import _choose_profile
    from specrl.profile.fingerprint import pair_fingerprint
    from specrl.profile.synthetic import linear_profile

    profile = linear_profile()
    profile.fingerprint = {**pair_fingerprint(micro_pair, k_max=4), "threads": 1}
    path = tmp_path / "shipped.json"
    profile.save(path)
    monkeypatch.setattr(specrl.envs, "default_profile_path", lambda: path)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            chosen, where, how = _choose_profile(micro_pair, DemoOptions(), tmp_path / "c")
            assert (where, how) == (path, "reused")
            assert not [w for w in caught if "threads differ" in str(w.message)]
            _choose_profile(micro_pair, DemoOptions(threads=2), tmp_path / "c")
            assert [
                w
                for w in caught
                if "threads differ from where it was measured (1 vs here 2)" in str(w.message)
            ]
    finally:
        torch.set_num_threads(before)


def test_a_demo_on_a_new_machine_measures_the_demo_grid(micro_pair, tmp_path, monkeypatch):
    """No profile matches: the demo measures every batch size up to its largest at the
    prompt lengths of DEMO_CONTEXTS, 3 repetitions, k_max 4, and caches the profile."""
    import torch

    import specrl.profile.measure
    from specrl.demo import DEMO_CONTEXTS, _choose_profile, cached_profile_path
    from specrl.profile.fingerprint import pair_fingerprint
    from specrl.profile.synthetic import linear_profile

    asked = {}

    def measure(pair, **kw):
        asked.update(kw)
        profile = linear_profile()
        profile.fingerprint = {**pair_fingerprint(pair, k_max=4), "threads": 1}
        return profile

    monkeypatch.setattr(specrl.profile.measure, "measure_profile", measure)
    before = torch.get_num_threads()
    try:  # the demo measures at one thread
        options = DemoOptions(max_batch=64, measure=True, progress=False)
        _, where, how = _choose_profile(micro_pair, options, tmp_path)
    finally:
        torch.set_num_threads(before)
    assert how == "measured" and DEMO_CONTEXTS == (16, 128, 256)
    assert where == cached_profile_path(pair_fingerprint(micro_pair, k_max=4), tmp_path)
    assert where.is_file()
    assert (asked["batch_sizes"], asked["contexts"], asked["reps"], asked["k_max"]) == (
        [1, 2, 4, 8, 16, 32, 64],
        [16, 128, 256],
        DemoOptions().profile_reps,
        4,
    )
    assert asked["progress"] is False  # `specrl demo --no-progress` hides its bar too


def test_the_demo_grid_reaches_its_max_batch():
    from specrl.demo import demo_batch_sizes

    assert demo_batch_sizes(128) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert demo_batch_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert demo_batch_sizes(48) == [1, 2, 4, 8, 16, 32, 48]
    assert demo_batch_sizes(1) == [1]
    assert demo_batch_sizes(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]


def test_a_profile_whose_grid_stops_below_max_batch_is_measured_again(
    micro_pair, tmp_path, monkeypatch, capsys
):
    """A matching profile whose batch sizes stop below --max-batch would serve the larger
    batches at its edge: the demo says so and measures the grid it needs."""
    import torch

    import specrl.envs
    import specrl.profile.measure
    from specrl.demo import _choose_profile
    from specrl.profile.fingerprint import pair_fingerprint
    from specrl.profile.synthetic import linear_profile

    fingerprint = {**pair_fingerprint(micro_pair, k_max=4), "threads": 1}
    shipped = linear_profile()
    shipped.fingerprint = fingerprint
    path = tmp_path / "shipped.json"
    shipped.save(path)
    monkeypatch.setattr(specrl.envs, "default_profile_path", lambda: path)
    largest = max(shipped.batch_sizes)
    asked = {}

    def measure(pair, **kw):
        asked.update(kw)
        return shipped

    monkeypatch.setattr(specrl.profile.measure, "measure_profile", measure)
    _, where, how = _choose_profile(micro_pair, DemoOptions(max_batch=largest), tmp_path / "c")
    assert (where, how) == (path, "reused") and not asked
    before = torch.get_num_threads()
    try:  # the demo measures at one thread
        _, _, how = _choose_profile(
            micro_pair, DemoOptions(max_batch=largest + 1, progress=False), tmp_path / "c"
        )
    finally:
        torch.set_num_threads(before)
    assert how == "measured" and asked["batch_sizes"][-1] == largest + 1
    assert f"its grid stops at batch {largest}, below the demo's --max-batch {largest + 1}" in (
        capsys.readouterr().out
    )


def test_the_command_line_passes_max_batch_and_profile_reps_to_the_demo(monkeypatch):
    import specrl.demo
    from specrl.cli import main

    seen = []
    monkeypatch.setattr(specrl.demo, "run_demo", seen.append)
    assert main(["demo", "--max-batch", "64", "--profile-reps", "5", "--no-progress"]) == 0
    assert (seen[0].max_batch, seen[0].profile_reps, seen[0].progress) == (64, 5, False)
    seen.clear()
    assert main(["demo"]) == 0
    defaults = DemoOptions()
    assert (seen[0].max_batch, seen[0].profile_reps) == (defaults.max_batch, defaults.profile_reps)
    assert (defaults.max_batch, defaults.profile_reps, defaults.timesteps) == (32, 2, 25_000)
