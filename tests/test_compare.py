"""`specrl compare`: every policy on the same traces; per-bucket rates, K shares, TPOT."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from specrl.compare import compare_policies
from specrl.envs import EpisodeResult, SurrogateSpecEnv
from specrl.errors import SpecrlError
from specrl.policies import make_policy
from specrl.profile.synthetic import linear_profile
from specrl.results import summarize


def _env(**kwargs):
    kwargs.setdefault("workload", "ramp")
    kwargs.setdefault("workload_kwargs", {"n_requests": 24, "peak": 8})
    return SurrogateSpecEnv(profile=linear_profile(), max_batch=8, **kwargs)


def test_summarize_aggregates_steps_by_bucket_and_k():
    a = EpisodeResult(10, 1.0, 3, 0.0, 0.0)
    a.step_batch, a.step_k = [1, 3, 3], [0, 2, 2]
    a.step_tokens, a.step_seconds = [1, 5, 4], [0.2, 0.5, 0.3]
    a.request_tpot_s = [0.1, 0.3]
    b = EpisodeResult(6, 2.0, 1, 0.0, 0.0)
    b.step_batch, b.step_k, b.step_tokens, b.step_seconds = [70], [1], [6], [2.0]
    b.request_tpot_s = [0.2]
    r = summarize("x", [a, b], k_max=2)
    assert r.tokens_per_s == pytest.approx(16 / 3.0)
    assert r.bucket_tokens_per_s == pytest.approx({"1": 5.0, "2-4": 9 / 0.8, "65-128": 3.0})
    assert r.bucket_steps == {"1": 1, "2-4": 2, "65-128": 1}
    assert r.k_share == pytest.approx({"0": 0.25, "1": 0.25, "2": 0.5})
    assert (r.tpot_p50_s, r.tpot_p99_s) == pytest.approx((0.2, 0.298))


def test_buckets_past_128_rows_are_reported_where_reached(tmp_path):
    from specrl.compare import ComparisonReport
    from specrl.features import BUCKET_LABELS
    from specrl.report.dashboard import policy_metrics

    def episode(batches):
        e = EpisodeResult(len(batches), float(len(batches)), 1, 0.0, 0.0)
        e.step_batch, e.step_k = batches, [0] * len(batches)
        e.step_tokens, e.step_seconds = batches, [1.0] * len(batches)
        return e

    big = summarize("off", [episode([300, 200, 100, 1])], k_max=2)
    small = summarize("fixed:2", [episode([100, 1])], k_max=2)
    assert big.bucket_steps == {"1": 1, "65-128": 1, "129-256": 1, "257-512": 1}
    assert big.bucket_tokens_per_s["257-512"] == 300.0
    report = ComparisonReport("surrogate", "w", 0, 1, [big, small])
    assert report.bucket_labels() == [*BUCKET_LABELS, "129-256", "257-512"]
    assert report.best_static_by_bucket()["257-512"] == "off"
    header = report.format().splitlines()[0]
    assert "| B 65-128 | B 129-256 | B 257-512 |" in header
    report.write_csv(tmp_path / "c.csv")
    with open(tmp_path / "c.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["bucket/257-512"] == "300.0" and rows[1]["bucket/257-512"] == ""
    metrics = policy_metrics(report, small)
    assert metrics["bucket/65-128/tokens_per_s"] == 100.0
    assert math.isnan(metrics["bucket/129-256/tokens_per_s"])


def test_every_policy_serves_the_same_traces():
    env = _env()
    specs = ["off", "fixed:2", "threshold:4:2", "goodput", "oracle"]
    policies = [make_policy(s, env=env) for s in specs]
    report = compare_policies(env, policies, seed=5, episodes=2, progress=False)
    names = [r.policy for r in report.results]
    assert names == ["off", "K=2", "K=4 if B<=2", "goodput", "oracle"]
    tokens = {sum(e.tokens for e in r.episodes) for r in report.results}
    assert len(tokens) == 1  # the same two traces for everyone: the same total work
    off = report.result("off")
    assert off.k_share["0"] == 1.0 and report.result("K=2").k_share["2"] == 1.0
    assert set(off.bucket_tokens_per_s) <= {"1", "2-4", "5-8"}
    assert report.best_static.policy in {"off", "K=2"}
    assert report.best_static.tokens_per_s == max(
        off.tokens_per_s, report.result("K=2").tokens_per_s
    )
    # The oracle's myopic choice beats always-off on this profile and workload.
    assert report.result("oracle").tokens_per_s > off.tokens_per_s
    assert "best static policy, among off, K=2: " in report.format()


def _static_report(speeds: dict[str, tuple[float, float]]) -> str:
    """``format()`` of a report whose policies ran at ``{name: (tokens/s at 1 row, at 4)}``."""
    from specrl.compare import ComparisonReport

    results = []
    for name, (one, four) in speeds.items():
        e = EpisodeResult(int(one + 4 * four), 2.0, 2, 0.0, 0.0)
        e.step_batch, e.step_k = [1, 4], [0, 0]
        e.step_tokens, e.step_seconds = [one, 4 * four], [1.0, 1.0]
        results.append(summarize(name, [e], k_max=2))
    return ComparisonReport("surrogate", "w", 0, 1, results).format()


def test_best_static_lines_name_the_policies_they_were_chosen_among():
    text = _static_report({"off": (10, 5), "K=1": (8, 9), "K=2": (6, 7), "goodput": (11, 11)})
    lines = text.splitlines()
    assert lines[2 + 4] == ""  # the table ends: the notes are no rows of it
    assert lines[7] == "best static policy, among off, K=1, K=2: K=1 (22 tokens/s)"
    assert lines[8] == "best static policy per bucket, among off, K=1, K=2: B 1: off, B 2-4: K=1"


def test_best_static_lines_are_left_out_with_one_static_policy():
    """As in the demo's live table, where off is the only static policy that ran."""
    text = _static_report({"off": (10, 5), "goodput": (11, 11), "lookup:t.json": (9, 12)})
    assert "best static" not in text  # neither a column nor a line
    assert text.splitlines()[0].startswith("| policy | tokens/s | / off | B 1 |")
    assert text.splitlines()[-1].startswith("fewest steps per episode in a bucket")
    assert text.splitlines()[-2] == ""


def test_paired_ratios_pair_episodes_on_the_same_trace():
    env = _env()
    policies = [make_policy(s, env=env) for s in ("off", "fixed:2")]
    report = compare_policies(env, policies, seed=3, episodes=3, progress=False)
    off, k2 = report.result("off"), report.result("K=2")
    assert off.episode_tokens_per_s == [e.tokens / e.seconds for e in off.episodes]
    ratios = report.paired_ratios("K=2", "off")
    assert ratios == pytest.approx(
        [a.tokens / a.seconds / (b.tokens / b.seconds) for a, b in zip(k2.episodes, off.episodes)]
    )
    assert len(ratios) == 3 and len(set(ratios)) == 3  # three traces, three ratios
    best = report.best_static.policy
    other = "off" if best == "K=2" else "K=2"
    spread = report.paired_ratios(other, best)
    row = next(line for line in report.format().splitlines() if line.startswith(f"| {other} |"))
    assert f"| {min(spread):.2f}-{max(spread):.2f} |" in row
    assert "min-max per episode" in report.format()
    fewest = min(r.bucket_steps["1"] for r in report.results) / 3
    assert f"B 1: {fewest:.1f}" in report.format().splitlines()[-1]
    with pytest.raises(SpecrlError, match="'K=9'"):
        report.paired_ratios("K=9", "off")
    summary = report.ratio("K=2", "off")
    assert summary["ratio"] == k2.tokens_per_s / off.tokens_per_s
    assert (summary["min"], summary["max"]) == (min(ratios), max(ratios))
    assert summary["se"] == pytest.approx(np.log(ratios).std(ddof=1) / np.sqrt(3))
    with pytest.raises(SpecrlError, match="'K=9'"):
        report.ratio("off", "K=9")


def test_cli_writes_json_and_csv(tmp_path, capsys):
    from specrl.cli import main

    linear_profile().save(tmp_path / "p.json")
    argv = [
        "compare",
        "--profile",
        str(tmp_path / "p.json"),
        "--workload",
        "ramp",
        "--n-requests",
        "16",
        "--max-batch",
        "8",
        "--episodes",
        "1",
        "--policies",
        "off,fixed:1,fixed:3,hf,ema,oracle",
        "--json",
        str(tmp_path / "out.json"),
        "--csv",
        str(tmp_path / "out.csv"),
    ]
    assert main(argv) == 0
    data = json.loads((tmp_path / "out.json").read_text())
    assert set(data) == {
        "env",
        "workload",
        "seed",
        "episodes",
        "results",
        "best_static",
        "best_static_by_bucket",
        "engineer",
        "engineer_by_tuning",
        "tuning",
        "interleaved",
    }
    assert data["engineer"] is None and data["tuning"] == {}  # neither tuned baseline ran
    assert data["engineer_by_tuning"] is None
    assert data["interleaved"] is False
    for label, name in data["best_static_by_bucket"].items():
        rates = {r["policy"]: r["bucket_tokens_per_s"].get(label, 0) for r in data["results"]}
        assert rates[name] == max(rates[p] for p in ("off", "K=1", "K=3"))
    assert (data["env"], data["workload"], data["seed"], data["episodes"]) == (
        "surrogate",
        "ramp",
        0,
        1,
    )
    first = data["results"][0]
    assert set(first) == {
        "policy",
        "tokens_per_s",
        "bucket_tokens_per_s",
        "k_share",
        "tpot_p50_s",
        "tpot_p99_s",
        "bucket_steps",
        "episode_tokens_per_s",
        "episode_speed",
    }
    assert first["episode_speed"] == []  # the surrogate's steps are the profile's
    assert set(first["bucket_steps"]) == set(first["bucket_tokens_per_s"])
    assert first["episode_tokens_per_s"] == [first["tokens_per_s"]]  # one episode
    assert [r["policy"] for r in data["results"]] == ["off", "K=1", "K=3", "hf", "ema", "oracle"]
    static = [r for r in data["results"] if r["policy"] in ("off", "K=1", "K=3")]
    best = max(static, key=lambda r: r["tokens_per_s"])
    assert data["best_static"] == {"policy": best["policy"], "tokens_per_s": best["tokens_per_s"]}
    rows = list(csv.DictReader((tmp_path / "out.csv").open()))
    assert [r["policy"] for r in rows] == ["off", "K=1", "K=3", "hf", "ema", "oracle"]
    assert float(rows[1]["k_share/1"]) == 1.0
    assert "| policy | tokens/s |" in capsys.readouterr().out


def test_cli_refuses_an_unknown_policy_naming_it(tmp_path, capsys):
    from specrl.cli import main

    linear_profile().save(tmp_path / "p.json")
    argv = ["compare", "--profile", str(tmp_path / "p.json"), "--policies", "off,turbo"]
    assert main(argv) == 2
    assert "'turbo'" in capsys.readouterr().err


def test_repeated_policy_names_are_refused():
    env = _env()
    with pytest.raises(SpecrlError, match="repeat a name"):
        compare_policies(env, [make_policy("off", env=env)] * 2, progress=False)


def test_policies_sharing_a_display_name_are_named_by_their_specs(tmp_path, capsys):
    from specrl.cli import main
    from specrl.policies import make_policies

    # Two schedules whose files share a name (both would show as schedule:s).
    specs = []
    for where, k in (("a", 1), ("b", 3)):
        (tmp_path / where).mkdir()
        path = tmp_path / where / "s.json"
        path.write_text(json.dumps({"num_speculative_tokens_per_batch_size": [[1, 8, k]]}))
        specs.append(f"schedule:{path}")
    env = _env()
    assert [p.name for p in make_policies(["off", *specs], env=env)] == ["off", *specs]
    linear_profile().save(tmp_path / "p.json")
    out = tmp_path / "r.json"
    argv = ["compare", "--profile", str(tmp_path / "p.json"), "--n-requests", "16"]
    argv += ["--max-batch", "8", "--episodes", "1", "--json", str(out)]
    assert main([*argv, "--policies", ",".join(["off", *specs])]) == 0
    results = {r["policy"]: r for r in json.loads(out.read_text())["results"]}
    assert list(results) == ["off", *specs]
    assert results[specs[0]]["k_share"] != results[specs[1]]["k_share"]
    # The same policy twice is still refused.
    capsys.readouterr()
    assert main([*argv, "--policies", "off,off"]) == 2
    assert "repeat a name: ['off', 'off']" in capsys.readouterr().err


def test_live_compare_refuses_the_oracle_before_building_the_env(capsys, monkeypatch):
    import specrl.cli.compare
    from specrl.cli import main

    def no_env(args):
        raise AssertionError("the live env was built (and its profile timed)")

    monkeypatch.setattr(specrl.cli.compare, "make_env", no_env)
    assert main(["compare", "--env", "live", "--policies", "off,oracle"]) == 2
    err = capsys.readouterr().err
    assert "cannot run in the live env: drop it from --policies, or compare with --env" in err


def test_an_unknown_workload_names_the_presets_and_trace_files():
    with pytest.raises(SpecrlError, match=r"'busy' is neither a preset \(mixed, .*steady-N for"):
        _env(workload="busy")


def test_n_requests_with_a_trace_file_is_refused(tmp_path, capsys):
    from specrl.cli import main
    from specrl.workload import preset_trace

    path = tmp_path / "t.json"
    preset_trace("ramp", n_requests=4, peak=4).save(path)
    args = ["compare", "--workload", str(path), "--policies", "off", "--episodes", "1"]
    assert main([*args, "--n-requests", "2"]) == 2
    assert capsys.readouterr().err == (
        f"specrl: error: --n-requests draws a preset's trace; {path} replays the requests it "
        "holds: drop --n-requests (or write a trace of that many with `specrl workload "
        "--n-requests N`)\n"
    )
    assert main(args) == 0


class _Recorder:
    """Wraps a policy; logs (name, episode_start) for every first step of an episode."""

    def __init__(self, policy, log):
        self.policy, self.name, self.log, self.calls = policy, policy.name, log, 0

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        self.calls += 1
        if episode_start is not None and episode_start[0]:
            self.log.append(self.name)
        return self.policy.predict(obs, state, episode_start, deterministic)


def test_policies_take_turns_forward_then_reversed_after_a_discarded_warmup():
    env = _env()
    log: list[str] = []
    specs = ("off", "fixed:1", "fixed:2")
    policies = [_Recorder(make_policy(s, env=env), log) for s in specs]
    report = compare_policies(env, policies, seed=2, episodes=4, progress=False, warmup_steps=5)
    # The warm-up (last policy), then ABBA: every policy's mean place in the order is 1.
    forward = ["off", "K=1", "K=2"]
    assert log == ["K=2"] + forward + forward[::-1] + forward + forward[::-1]
    # The warm-up is not counted: each policy has its 4 episodes, the same 4 traces.
    assert [len(r.episodes) for r in report.results] == [4, 4, 4]
    steps = [sum(e.steps for e in r.episodes) for r in report.results]
    assert [p.calls for p in policies] == [steps[0], steps[1], steps[2] + 5]  # 5 warm-up steps
    assert len({r.episodes[0].tokens for r in report.results}) == 1
    with pytest.raises(SpecrlError, match="warmup_steps"):
        compare_policies(env, policies, progress=False, warmup_steps=-1)


def test_an_odd_number_of_live_rounds_gets_a_note_naming_the_flag():
    from specrl.envs.rollout import odd_rounds_note

    assert odd_rounds_note(4, "--episodes") is None
    note = odd_rounds_note(3, "--live-repeats")
    assert note.startswith("note: 3 rounds") and note.endswith("use an even --live-repeats")
