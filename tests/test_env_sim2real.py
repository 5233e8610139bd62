"""Sim-to-real comparison and the surrogate benchmark command run end to end."""

from __future__ import annotations

import warnings

import pytest

from specrl.envs import LiveSpecEnv, SurrogateSpecEnv
from specrl.envs.sim2real import compare, format_comparison
from specrl.policies import BatchThreshold, FixedK
from specrl.profile import pair_fingerprint
from specrl.profile.synthetic import linear_profile
from specrl.workload import LengthDist, preset_trace


def _ramp_envs(micro_pair, *, n_requests: int, new_tokens: int):
    """A tiny ramp trace (peak 2) live on the micro pair and in the surrogate of a linear
    profile: (profile, trace, env kwargs, live env, surrogate env)."""
    profile = linear_profile(k_max=2)
    profile.fingerprint = pair_fingerprint(micro_pair, k_max=2)
    out = LengthDist(median=new_tokens, sigma=0, lo=new_tokens, hi=new_tokens)
    trace = preset_trace(
        "ramp",
        seed=0,
        n_requests=n_requests,
        peak=2,
        output_lengths=out,
        prompt_lengths=LengthDist(median=8, sigma=0, lo=8, hi=8),
    )
    common = {"workload": trace, "k_max": 2, "max_batch": 2, "max_len": 32}
    live = LiveSpecEnv(pair=micro_pair, profile=profile, check_profile=False, **common)
    return profile, trace, common, live, SurrogateSpecEnv(profile=profile, **common)


def test_compare_runs_each_policy_live_and_simulated(micro_pair):
    profile, trace, common, live, surrogate = _ramp_envs(micro_pair, n_requests=6, new_tokens=6)
    policies = [FixedK(0), FixedK(2), BatchThreshold(2, 1, 2)]
    rows = compare(live, surrogate, policies, live_repeats=1, surrogate_seeds=3, warmup_steps=2)
    assert [r.policy for r in rows] == ["off", "K=2", "K=2 if B<=1"]
    for r in rows:
        assert r.live_tokens_per_s > 0 and r.surrogate_tokens_per_s > 0
        assert r.ratio == pytest.approx(r.surrogate_tokens_per_s / r.live_tokens_per_s)
        # Decode and prefill split each episode's seconds; the trace's tokens are fixed.
        assert r.live_decode_s + r.live_prefill_s == pytest.approx(
            trace.total_tokens / r.live_tokens_per_s
        )
        assert r.surrogate_decode_s + r.surrogate_prefill_s == pytest.approx(
            trace.total_tokens / r.surrogate_tokens_per_s
        )
        assert 0 < r.live_prefill_s < r.live_decode_s
        assert 0 < r.surrogate_prefill_s < r.surrogate_decode_s
        assert r.to_json()["decode_ratio"] == pytest.approx(r.surrogate_decode_s / r.live_decode_s)
        if r.policy == "off":  # nothing drafted: the estimate stays at 0
            assert r.live_acceptance_mean == r.surrogate_acceptance_mean == 0.0
        else:
            assert 0 < r.live_acceptance_mean <= 1 and 0 < r.surrogate_acceptance_mean <= 1
    table = format_comparison(rows).splitlines()
    assert table[0].startswith("| policy | live tokens/s | surrogate tokens/s | surrogate / live")
    assert "| decode s, surrogate / live | prefill s, surrogate / live |" in table[0]
    off = rows[0]
    assert (
        f"({off.decode_ratio:.2f}) | " in table[2] and f"({off.prefill_ratio:.2f}) | " in table[2]
    )
    assert len(table) == 2 + len(policies)
    # Off has no acceptance observation: its cells read "-", a drafting policy's its figures.
    assert "| - | - |" in table[2] and "±" not in table[2]
    k2 = rows[1]
    assert f"| {k2.live_acceptance_mean:.3f} ± {k2.live_acceptance_std:.3f} | " in table[3]


def test_acceptance_statistics_weight_each_step_by_its_rows():
    """A step counts as many times as it served rows: a drained episode's last request, alone
    for many steps, weighs one row, not a step's worth of the whole batch."""
    import numpy as np

    from specrl.envs.rollout import EpisodeResult
    from specrl.envs.sim2real import compare_runs

    def result(acceptance, batch):
        return EpisodeResult(
            tokens=10,
            seconds=1.0,
            steps=len(batch),
            episode_return=0.0,
            mean_step_tokens_per_s=10.0,
            step_batch=batch,
            step_acceptance=acceptance,
        )

    # 6 rows at 0.8 for one step, then one row at 0.2 for two steps: by rows the mean is
    # (6 * 0.8 + 2 * 0.2) / 8 = 0.65, where by steps it would read 0.4.
    live = {"K=2": [result([0.8, 0.2, 0.2], [6, 1, 1])]}
    env = SurrogateSpecEnv(
        profile=linear_profile(k_max=2),
        workload=preset_trace("steady-8", seed=0, n_requests=4, peak=2),
        k_max=2,
        max_batch=2,
    )
    (row,) = compare_runs(live, env, [FixedK(2)], surrogate_seeds=1)
    assert row.live_acceptance_mean == pytest.approx(0.65)
    assert row.live_acceptance_std == pytest.approx(np.sqrt((6 * 0.15**2 + 2 * 0.45**2) / 8))


def test_acceptance_gap_and_observed():
    """The gap is the larger of the mean and std gaps; a row is observed when either side
    has a nonzero figure, so a surrogate that saw acceptance where live saw none still
    counts (as a miss)."""
    from specrl.envs.sim2real import Comparison

    row = Comparison("K=2", 100.0, 100.0, 0.70, 0.10, 0.66, 0.17)
    assert row.observed and row.acceptance_gap == pytest.approx(0.07)
    assert not Comparison("off", 100.0, 100.0).observed
    one_sided = Comparison("x", 100.0, 100.0, surrogate_acceptance_mean=0.2)
    assert one_sided.observed and one_sided.acceptance_gap == pytest.approx(0.2)


def test_acceptance_line_counts_drafting_runs_and_names_the_misses():
    from specrl.cli.validate_surrogate import acceptance_line
    from specrl.envs.sim2real import Comparison

    rows = [
        Comparison("off", 100.0, 100.0, trace="mixed"),
        Comparison("K=2", 100.0, 100.0, 0.70, 0.10, 0.66, 0.17, trace="mixed"),
        Comparison("K=4", 100.0, 100.0, 0.70, 0.10, 0.68, 0.12, trace="mixed"),
    ]
    assert acceptance_line(rows) == (
        "acceptance observation (mean and std) within 0.05 for 1 of 2 policy runs that drafted"
        " (1 never drafted: no observation to compare); outside: mixed/K=2 0.070"
    )
    assert acceptance_line(rows[2:]) == (
        "acceptance observation (mean and std) within 0.05 for 1 of 1 policy runs that drafted"
    )


def test_acceptance_line_says_which_misses_one_draw_of_the_trace_explains():
    """A miss in the mean within 2 draw std of the surrogate is named as one draw's; a miss
    beyond it, or in the std, is not."""
    from specrl.cli.validate_surrogate import acceptance_line
    from specrl.envs.sim2real import Comparison

    def row(policy, live_mean, sim_mean, draw, sim_std=0.10):
        return Comparison(
            policy,
            1.0,
            1.0,
            live_mean,
            0.10,
            sim_mean,
            sim_std,
            trace="mixed",
            surrogate_draw_std=draw,
        )

    rows = [
        row("a", 0.716, 0.777, 0.04),  # 1.5 draw std
        row("b", 0.60, 0.70, 0.04),  # 2.5 draw std
        row("c", 0.70, 0.72, 0.04, sim_std=0.2),  # the std is off
        row("d", 0.70, 0.72, 0.04),
    ]
    assert rows[0].gap_in_draws == pytest.approx(0.061 / 0.04)
    assert acceptance_line(rows) == (
        "acceptance observation (mean and std) within 0.05 for 1 of 4 policy runs that drafted"
        "; outside: mixed/a 0.061 (mean gap 1.5 draw std), mixed/b 0.100 (mean gap 2.5 draw "
        "std), mixed/c 0.100 (mean gap 0.5 draw std). 1 of these 3 are within 2 draw std of "
        "the surrogate's mean: one draw of the trace's requests explains them, so pool more "
        "draws (--trace-seeds) before reading them as the surrogate's error"
    )


def test_bench_surrogate_prints_steps_per_second(tmp_path, capsys):
    from specrl.cli import main

    linear_profile().save(tmp_path / "p.json")
    assert (
        main(["bench", "surrogate", "--profile", str(tmp_path / "p.json"), "--steps", "3000"]) == 0
    )
    assert "env steps/s (3000 steps" in capsys.readouterr().out


def test_cli_reports_a_bad_profile_in_one_line(tmp_path, capsys):
    from specrl.cli import main

    (tmp_path / "p.json").write_text("{}")
    assert main(["bench", "surrogate", "--profile", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specrl: error: ") and "p.json" in err and "\n" not in err


def test_speed_checks_bracket_each_round_and_match_the_surrogate(micro_pair):
    """A check before each round of one episode per policy; the speed-matched surrogate
    runs the same policy objects on the rescaled profile: at ratio 1 it reads exactly the
    plain surrogate, at ratio 2 (every step twice as slow) fewer tokens/s."""
    from specrl.envs.sim2real import LiveRuns, compare_runs
    from specrl.profile.freshness import CellCheck, FreshnessReport, PrefillCheck, speed_matched

    profile, trace, common, live, surrogate = _ramp_envs(micro_pair, n_requests=4, new_tokens=5)
    policies = [FixedK(0), FixedK(2)]
    events = []
    runs = LiveRuns(live, policies, repeats=2, warmup_steps=0)
    results = runs.run_all(on_episode=events.append, before_round=lambda: events.append("check"))
    assert events == ["check", "off", "K=2", "check", "K=2", "off"]  # ABBA

    def at(ratio, prefill=None):
        cells = [CellCheck(b, k, 1.0, ratio) for b in (1, 8) for k in (0, 2)]
        admissions = [] if prefill is None else [PrefillCheck(8, 1.0, prefill)]
        fast = speed_matched(profile, [FreshnessReport(cells, admissions)])
        return SurrogateSpecEnv(profile=fast, **common)

    same = compare_runs(results, surrogate, policies, surrogate_seeds=2, matched=at(1.0, 1.0))
    slow = compare_runs(results, surrogate, policies, surrogate_seeds=2, matched=at(2.0))
    long = compare_runs(results, surrogate, policies, surrogate_seeds=2, matched=at(1.0, 2.0))
    plain = compare_runs(results, surrogate, policies, surrogate_seeds=2)
    for s, w, g, p in zip(same, slow, long, plain, strict=True):
        assert s.matched_tokens_per_s == s.surrogate_tokens_per_s
        assert s.matched_ratio == s.ratio
        assert s.matched_decode_s == s.surrogate_decode_s
        assert s.matched_prefill_s == s.surrogate_prefill_s
        assert w.matched_tokens_per_s < 0.8 * w.surrogate_tokens_per_s
        assert w.matched_decode_s > 1.5 * w.surrogate_decode_s
        assert g.matched_prefill_s > 1.5 * g.surrogate_prefill_s  # the admissions' ratio
        assert p.to_json()["matched_ratio"] != p.to_json()["matched_ratio"]  # NaN: not measured
    lines = format_comparison(slow).splitlines()
    head = "| speed-matched tokens/s | speed-matched / live | speed-matched prefill / live |"
    assert lines[0].endswith(head)
    assert lines[2].endswith(
        f"| {slow[0].matched_tokens_per_s:.0f} | {slow[0].matched_ratio:.2f} | "
        f"{slow[0].matched_prefill_ratio:.2f} |"
    )
    assert "speed-matched" not in format_comparison(plain)


def test_validate_surrogate_writes_the_speed_checks_and_both_ratios(
    micro_pair_paths, tmp_path, monkeypatch, capsys
):
    """The command end to end on the micro pair: one check before each of the 2 rounds and
    one after, their medians in the JSON, and both ratios per policy (a synthetic profile,
    so --force; the figures themselves mean nothing here)."""
    import json
    from pathlib import Path

    from specrl.cli import main

    monkeypatch.setenv("SPECRL_HOME", str(Path(micro_pair_paths.target_path).parents[2]))
    linear_profile(k_max=2).save(tmp_path / "p.json")
    trace = preset_trace(
        "ramp",
        seed=0,
        n_requests=4,
        peak=2,
        output_lengths=LengthDist(median=5, sigma=0, lo=5, hi=5),
        prompt_lengths=LengthDist(median=8, sigma=0, lo=8, hi=8),
    )
    trace.save(tmp_path / "t.json")
    args = ["validate-surrogate", "--profile", str(tmp_path / "p.json"), "--preset", "micro"]
    args += ["--force", "--trace", str(tmp_path / "t.json"), "--policies", "off,fixed:2"]
    args += ["--live-repeats", "2", "--surrogate-seeds", "2", "--json", str(tmp_path / "s.json")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the synthetic profile is not this machine's
        assert main(args) == 0
    out = json.loads((tmp_path / "s.json").read_text())
    (checks,) = out["speed_checks"]
    assert checks["trace"] == trace.name and checks["checks"] == 3
    assert [(b, k) for b, k, _ in checks["ratios"]] == [(b, k) for b in (1, 8, 64) for k in (0, 2)]
    assert [p["policy"] for p in out["policies"]] == ["off", "K=2"]
    for p in out["policies"]:
        assert p["matched_ratio"] == pytest.approx(
            p["matched_tokens_per_s"] / p["live_tokens_per_s"]
        )
        assert p["matched_tokens_per_s"] > 0
    printed = capsys.readouterr().out
    assert "of 2 ratios within 0.9-1.1" in printed
    assert "speed-matched: " in printed and "of 2 within 0.9-1.1" in printed
    # Off never drafts: it is left out of the acceptance count, and said so.
    assert "within 0.05 for " in printed
    assert " of 1 policy runs that drafted (1 never drafted: no observation to compare)" in printed


def test_live_runs_keep_alternating_across_traces(micro_pair):
    """The rounds of a second trace draw continue the ABBA order of the first: with
    first_round=1 the reversed order plays first."""
    from specrl.envs.sim2real import LiveRuns

    _, _, _, live, _ = _ramp_envs(micro_pair, n_requests=2, new_tokens=3)
    policies = [FixedK(0), FixedK(2)]
    played = []
    LiveRuns(live, policies, repeats=2, warmup_steps=0, first_round=1).run_all(played.append)
    assert played == ["K=2", "off", "off", "K=2"]


def test_compare_runs_pools_every_trace_draw():
    """Given one surrogate env per trace draw, each row pools surrogate_seeds episodes of
    every draw: its tokens/s is sum(tokens) / sum(seconds) over all of them, and its
    acceptance statistics are those of every step of every episode, weighted by rows."""
    import numpy as np

    from specrl.envs.rollout import run_episode
    from specrl.envs.sim2real import compare_runs

    profile = linear_profile(k_max=2)
    envs = [
        SurrogateSpecEnv(
            profile=profile,
            workload=preset_trace("steady-8", seed=s, n_requests=12, peak=4),
            k_max=2,
            max_batch=4,
        )
        for s in (0, 1)
    ]
    assert envs[0].workload.requests != envs[1].workload.requests
    policy = FixedK(2)
    live = {"K=2": [run_episode(envs[0], policy, seed=9)]}
    (row,) = compare_runs(live, envs, [policy], surrogate_seeds=2)
    sims = [run_episode(e, policy, seed=s) for e in envs for s in range(2)]
    assert row.surrogate_tokens_per_s == pytest.approx(
        sum(r.tokens for r in sims) / sum(r.seconds for r in sims)
    )
    steps = np.concatenate([r.step_acceptance for r in sims])
    rows = np.concatenate([r.step_batch for r in sims])
    assert rows.min() >= 1 and rows.max() > rows.min()
    mean = (steps * rows).sum() / rows.sum()
    assert row.surrogate_acceptance_mean == pytest.approx(mean)
    assert row.surrogate_acceptance_std == pytest.approx(
        np.sqrt(((steps - mean) ** 2 * rows).sum() / rows.sum())
    )
    means = [np.average(r.step_acceptance, weights=r.step_batch) for r in sims]
    assert len(set(means)) > 1
    assert row.surrogate_draw_std == pytest.approx(np.std(means, ddof=1) / np.sqrt(2))
    (one,) = compare_runs(live, envs[0], [policy], surrogate_seeds=2)
    assert one.surrogate_tokens_per_s != pytest.approx(row.surrogate_tokens_per_s)
    assert one.surrogate_draw_std == pytest.approx(np.std(means[:2], ddof=1))


def test_validate_surrogate_trace_seeds_draw_presets_and_refuse_a_trace_file(tmp_path, capsys):
    import argparse

    from specrl.cli import main
    from specrl.cli.validate_surrogate import SIM2REAL_TRACES, _traces

    args = argparse.Namespace(trace=None, trace_seeds=3, seed=5)
    draws = _traces(args)
    assert [[t.name for t in d] for d in draws] == [[n] * 3 for n, _, _ in SIM2REAL_TRACES]
    for (name, n, peak), d in zip(SIM2REAL_TRACES, draws, strict=True):
        for i, t in enumerate(d):
            assert t.requests == preset_trace(name, seed=5 + i, n_requests=n, peak=peak).requests
    preset_trace("steady-8", seed=0, n_requests=4, peak=2).save(tmp_path / "t.json")
    base = ["validate-surrogate", "--profile", str(tmp_path / "p.json")]
    assert main([*base, "--trace", str(tmp_path / "t.json"), "--trace-seeds", "2"]) == 2
    err = capsys.readouterr().err
    assert "--trace-seeds" in err and "--trace" in err
    # The oracle reads the surrogate's hidden rates, and every policy here runs live too.
    assert main([*base, "--policies", "off,oracle"]) == 2
    assert "the oracle reads the surrogate's true" in capsys.readouterr().err
    # The per-request estimate reads the profile as the live envs are built, before --measure.
    assert main([*base, "--measure", "--acceptance-estimate", "requests"]) == 2
    err = capsys.readouterr().err
    assert "measure first (`specrl profile --out P.json`)" in err
    assert not (tmp_path / "p.json").exists()
