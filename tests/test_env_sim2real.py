"""Sim-to-real comparison and the surrogate benchmark command run end to end."""

from __future__ import annotations

import pytest

from specrl.envs import LiveSpecEnv, SurrogateSpecEnv
from specrl.envs.sim2real import compare, format_comparison
from specrl.policies import BatchThreshold, FixedK
from specrl.profile import pair_fingerprint
from specrl.profile.synthetic import linear_profile
from specrl.workload import LengthDist, preset_trace


def test_compare_runs_each_policy_live_and_simulated(micro_pair):
    profile = linear_profile(k_max=2)
    profile.fingerprint = pair_fingerprint(micro_pair, k_max=2)
    trace = preset_trace(
        "ramp",
        seed=0,
        n_requests=6,
        peak=2,
        output_lengths=LengthDist(median=6, sigma=0, lo=6, hi=6),
        prompt_lengths=LengthDist(median=8, sigma=0, lo=8, hi=8),
    )
    common = {"workload": trace, "k_max": 2, "max_batch": 2, "max_len": 32}
    live = LiveSpecEnv(pair=micro_pair, profile=profile, check_profile=False, **common)
    surrogate = SurrogateSpecEnv(profile=profile, **common)
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
