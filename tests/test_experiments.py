"""The scripts in experiments/: each --help, and each run at a tiny budget."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import shutil
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from train_helpers import tiny

from specrl.dataclass_cli import parse
from specrl.errors import SpecrlError

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = (
    "train_ppo",
    "compare",
    "seeds",
    "engineer",
    "table_headroom",
    "row_headroom",
    "paired_spread",
    "headroom",
)


TINY_ROLLOUT = ("--n-envs", "2", "--n-steps", "64", "--batch-size", "64")
"""PPO rollouts of 128 steps: a 256-step run trains 256."""


def load(name: str):
    sys.path.insert(0, str(REPO / "experiments"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(REPO / "experiments"))


def field_docs(cls) -> dict[str, str]:
    """Each field's docstring (the string right below it in the class body), ``cls``'s own
    and its dataclass parents'."""
    docs = {}
    for klass in reversed(cls.__mro__[:-1]):
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, after in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr):
                if isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                    docs[node.target.id] = after.value.value
    return docs


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_lists_every_field_with_its_docstring(script):
    done = subprocess.run(
        [sys.executable, str(REPO / "experiments" / f"{script}.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    module = load(script)
    docs = field_docs(module.Args)
    assert set(docs) == {f.name for f in dataclasses.fields(module.Args)}
    for name, doc in docs.items():
        assert "--" + name.replace("_", "-") in done.stdout
        assert doc.split()[0] in done.stdout
    # The description is the docstring's whole first paragraph, not its first line.
    first_paragraph = " ".join(module.__doc__.strip().split("\n\n")[0].split())
    assert first_paragraph in " ".join(done.stdout.split())


def test_train_ppo_script_takes_one_env_live_unless_told():
    train_ppo = load("train_ppo")
    assert parse(train_ppo.Args, ["--out", "r"]).config().n_envs == 8
    live = parse(train_ppo.Args, ["--out", "r", "--env", "live"]).config()
    assert (live.env, live.n_envs) == ("live", 1)
    two = parse(train_ppo.Args, ["--out", "r", "--env", "surrogate", "--n-envs", "2"])
    assert two.config().n_envs == 2
    with pytest.raises(SpecrlError, match="n_envs must be 1"):
        parse(train_ppo.Args, ["--out", "r", "--env", "live", "--n-envs", "2"]).config()


def test_compare_script_writes_each_workloads_comparison(tmp_path):
    compare = load("compare")
    out = tmp_path / "cmp"
    args = [
        "--out",
        str(out),
        "--workloads",
        "ramp,steady-4",
        "--policies",
        "off,fixed:2",
        "--episodes",
        "1",
        "--max-batch",
        "8",
        "--n-requests",
        "8",
        "--wandb",
        "offline",
    ]
    assert compare.main(args) == 0
    for workload in ("ramp", "steady-4"):
        obj = json.loads((out / f"compare-{workload}.json").read_text())
        assert [r["policy"] for r in obj["results"]] == ["off", "K=2"]
        assert obj["workload"] == workload and obj["seed"] == 20_000
        assert (out / f"compare-{workload}.csv").read_text().startswith("policy,tokens_per_s")
        assert (out / f"compare-{workload}-buckets.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list((out / "wandb").glob("offline-run-*"))) == 2 * 3  # 2 policies + summary


@pytest.mark.slow  # about 30 s: four training runs
def test_seeds_script_reports_the_mean_and_std_of_every_ratio(tmp_path, capsys):
    seeds = load("seeds")
    out = tmp_path / "seeds"
    args = [
        "--out",
        str(out),
        "--seeds",
        "0,1",
        "--total-timesteps",
        "256",
        "--workloads",
        "ramp,steady-8",
        "--eval-workloads",
        "ramp",
        "--episodes",
        "1",
        "--max-batch",
        "8",
        "--n-requests",
        "8",
        *TINY_ROLLOUT,
        "--net-arch",
        "8",
        "--eval-every",
        "0",
        "--wandb",
        "disabled",
    ]
    assert seeds.main(args) == 0
    summary = json.loads((out / "seeds.json").read_text())
    assert set(summary["per_seed"]) == {"0", "1"}
    for ratio in seeds.RATIOS:
        values = [summary["per_seed"][s]["ramp"][ratio] for s in ("0", "1")]
        assert all(v > 0 for v in values)
        assert summary["mean"]["ramp"][ratio] == pytest.approx(statistics.fmean(values))
        assert summary["std"]["ramp"][ratio] == pytest.approx(statistics.stdev(values))
    trials = out / "trials"
    for s in (0, 1):
        (trial,) = trials.glob(f"*-ramp+steady-8-s{s}")
        assert (trial / "table.json").is_file()
        assert (trial / "run" / "model.zip").is_file()
    assert (out / "summary.json").is_file()

    # Again with the same --out: the sweep resumed, both finished seeds reused, the same
    # figures come out.
    model = (trial / "run" / "model.zip").read_bytes()
    capsys.readouterr()
    assert seeds.main(args) == 0
    assert capsys.readouterr().out.count(": reused") == 2
    assert json.loads((out / "seeds.json").read_text()) == summary
    assert (trial / "run" / "model.zip").read_bytes() == model
    # Other training arguments than the sweep there was started with: refused before Ray
    # starts, nothing touched.
    longer = [*args[: args.index("--total-timesteps") + 1], "512"]
    longer += args[args.index("--total-timesteps") + 2 :]
    assert seeds.main(longer) == 2
    assert "holds a sweep of another spec" in capsys.readouterr().err
    assert (trial / "run" / "model.zip").read_bytes() == model
    # A repeated seed would read a spread of 0: refused before anything runs.
    repeated = [*args[: args.index("--seeds") + 1], "0,0"] + args[args.index("--seeds") + 2 :]
    assert seeds.main(repeated) == 2
    assert "--seeds 0,0 repeats a seed" in capsys.readouterr().err


def test_a_trial_continues_a_stopped_run_from_its_checkpoint(tmp_path):
    from specrl.profile.synthetic import linear_profile
    from specrl.train import latest_checkpoint, load_config
    from specrl.train.reuse import train_or_resume

    profile = tmp_path / "linear.json"
    linear_profile().save(profile)
    config = tiny(
        tmp_path / "run",
        profile,
        total_timesteps=256,
        workloads=("ramp",),
        checkpoint_every=128,
        eval_every=0,
        warm_start="none",
    )
    assert train_or_resume(config) == "trained"
    run = Path(config.out)
    # As if stopped after the first checkpoint: the last one and the finished files gone.
    for name in ("summary.json", "model.zip"):
        (run / name).unlink()
    last = latest_checkpoint(run).path
    assert last.name.endswith("256")
    for f in sorted(last.rglob("*"), reverse=True):
        f.unlink() if f.is_file() else f.rmdir()
    last.rmdir()
    assert latest_checkpoint(run).num_timesteps == 128
    assert train_or_resume(config) == "resumed"
    assert json.loads((run / "summary.json").read_text())["num_timesteps"] == 256
    assert train_or_resume(config) == "reused"
    # Made with settings a resume cannot change: refused, or (a cache) trained again.
    other = dataclasses.replace(config, gamma=0.9)
    with pytest.raises(SpecrlError, match=rf"{run} holds a run with another gamma; give it up"):
        train_or_resume(other, hint="give it up")
    said = []
    assert train_or_resume(other, on_change="restart", say=said.append) == "trained"
    assert said == [f"  {run} was trained with other settings (gamma)", f"  starting {run} again"]
    assert load_config(run).gamma == 0.9
    assert train_or_resume(config, on_change="restart") == "trained"
    # As if stopped before its first checkpoint: only config.json and logs there. Nothing to
    # go on from, so it starts again (`specrl train --resume` would refuse).
    for name in ("summary.json", "model.zip", "best_model.zip", "last_model.zip", "checkpoints"):
        shutil.rmtree(run / name) if (run / name).is_dir() else (run / name).unlink()
    assert train_or_resume(config) == "trained"
    assert json.loads((run / "summary.json").read_text())["num_timesteps"] == 256


@pytest.mark.slow
def test_draft_size_script_compares_two_drafts_of_one_target(tmp_path, capsys):
    """Slow (40-60 s on 2 cores: a second draft built and two profiles measured); the sweep
    it runs on is tested in the default suite (tests/test_sweep.py)."""
    draft_size = load("draft_size")
    out = tmp_path / "drafts"
    args = [
        "--out",
        str(out),
        "--presets",
        "micro,micro-draft3",
        "--batch-sizes",
        "1,2",
        "--contexts",
        "16",
        "--reps",
        "1",
        "--acceptance-rows",
        "8",
        "--total-timesteps",
        "256",
        *TINY_ROLLOUT,
        "--workloads",
        "ramp",
        "--episodes",
        "1",
        "--n-requests",
        "8",
        "--wandb",
        "disabled",
    ]
    assert draft_size.main(args) == 0
    assert "micro: PPO trained 256 steps" in capsys.readouterr().out
    results = json.loads((out / "draft_size.json").read_text())
    assert results["micro"]["draft_layers"] == 1 and results["micro-draft3"]["draft_layers"] == 3
    assert results["micro-draft3"]["draft_params"] > results["micro"]["draft_params"]
    for preset in ("micro", "micro-draft3"):
        r = results[preset]
        assert set(r["best_k_by_batch"]) == {"1", "2"}
        # The table's own batch ranges, which cover 1..max_batch (2 here).
        ranges = [tuple(map(int, key.split("-"))) for key in r["table_k_by_batch"]]
        assert ranges[0][0] == 1 and ranges[-1][-1] == 2
        assert all(0 <= k <= 4 for k in r["table_k_by_batch"].values())
        assert r["crossover_batch"] in (None, 1, 2)
        assert 0 < r["mean_acceptance"] <= 1 and r["table_over_best_static"]["ramp"] > 0
        (trial,) = (out / "trials").glob(f"{preset}-mixed+*")
        assert (trial / "table.json").is_file() and (trial / "table.png").is_file()
        assert (out / "profiles" / f"{preset}.json").is_file()


def test_engineer_script_gives_each_ratio_its_standard_error():
    from types import SimpleNamespace

    from specrl.results import standard_error

    engineer = load("engineer")
    ratios = [1.02, 0.99, 1.00, 1.01]
    logs = np.log(ratios)
    assert standard_error(ratios) == pytest.approx(logs.std(ddof=1) / 2)
    assert standard_error([1.03]) == 0.0
    report = SimpleNamespace(ratio=lambda a, b: {"ratio": 1.01, "se": 0.002})
    assert engineer._ratio(report, "native", "sweep") == {
        "ratio": 1.01,
        "se": 0.002,
        "reference": "sweep",
    }


def test_engineer_script_rates_against_the_benchmarks_pick_where_hindsight_picks_the_other():
    from specrl.compare import ComparisonReport
    from specrl.results import PolicyResult

    engineer = load("engineer")
    rates = {  # two episodes each: the engineer's ratios pair up episode by episode
        "off": [80.0, 80.0],
        "threshold:tuned": [101.0, 103.0],
        "sweep": [100.0, 100.0],
        "sweep:trtllm": [99.0, 99.0],
        "lookup:learned.json": [102.0, 102.0],
        "lookup:table.json": [104.0, 104.0],
        "schedule:vllm": [100.0, 100.0],
        "schedule:trtllm": [99.0, 99.0],
        "oracle": [106.0, 106.0],
    }
    results = [
        PolicyResult(n, sum(r) / 2, {}, {}, 0.1, 0.2, episode_tokens_per_s=r)
        for n, r in rates.items()
    ]
    tuned = lambda rate: {"tokens_per_s": rate, "seeds": [50_000, 50_001]}  # noqa: E731
    tuning = {"threshold:tuned": tuned(90.0), "sweep": tuned(91.0), "sweep:trtllm": tuned(95.0)}
    report = ComparisonReport("surrogate", "ramp", 20_000, 2, results, tuning)
    row = engineer._row(report, "ramp", ["vllm", "trtllm"])
    assert row["engineer"] == "threshold:tuned"  # the better on these episodes: 102 against 100
    assert row["vllm"]["ratio"] == pytest.approx(100 / 102)
    assert row["engineer_by_tuning"] == "sweep"  # the better on the tuning seeds: 91 against 90
    mine = row["by_tuning"]
    assert mine["engineer"]["ratio"] == pytest.approx(102 / 100)  # the hindsight
    assert mine["vllm"]["ratio"] == pytest.approx(1.0)
    assert mine["native"]["ratio"] == pytest.approx(1.04)
    assert (mine["native"]["min"], mine["native"]["max"]) == pytest.approx((1.04, 1.04))
    # Held to TensorRT-LLM's format: on these episodes the threshold (102 against 99), on the
    # tuning seeds sweep:trtllm (95 against 90).
    assert row["trtllm"]["ratio"] == pytest.approx(99 / 102)
    assert mine["trtllm"]["ratio"] == pytest.approx(1.0)
    text = engineer._markdown(
        engineer.Args(run="r", per_workload=True), [row], ["vllm", "trtllm"], "p.json", Path("r")
    )
    assert "| ramp | sweep | 1.0200 ± 0.0098 | 1.0200 ± 0.0000 | 1.0400 ± 0.0000 | 1.0000" in text


@pytest.mark.slow  # about 11 s: a training run, then every export searched
def test_engineer_script_rates_the_table_and_every_export_against_the_engineer(tmp_path, capsys):
    from specrl.profile.synthetic import linear_profile
    from specrl.train import train
    from specrl.train.search import stack_search_episodes

    profile = tmp_path / "linear.json"
    linear_profile().save(profile)
    config = tiny(tmp_path / "run", profile, eval_every=0)
    train(config, progress=False)
    engineer = load("engineer")
    out = tmp_path / "eng"
    argv = ["--run", config.out, "--out", str(out), "--workloads", "ramp", "--episodes", "2"]
    assert engineer.main(argv) == 0
    summary = json.loads((out / "engineer.json").read_text())
    (row,) = summary["rows"]
    report = summary["reports"]["ramp"]
    rate = {r["policy"]: r["tokens_per_s"] for r in report["results"]}
    eng = max(rate["threshold:tuned"], rate["sweep"])
    assert row["engineer"] == report["engineer"]["policy"]
    assert row["native"]["ratio"] == pytest.approx(rate["lookup:table.json"] / eng)
    assert row["vllm"]["ratio"] == pytest.approx(rate["schedule:vllm"] / eng)
    trt = max(rate["threshold:tuned"], rate["sweep:trtllm"])
    assert row["trtllm"]["ratio"] == pytest.approx(rate["schedule:trtllm"] / trt)
    assert row["oracle"]["ratio"] == pytest.approx(rate["oracle"] / eng)
    # Beside it, the engineer who picks the better of the two on the tuning seeds.
    tuned = report["tuning"]
    own = max(("threshold:tuned", "sweep"), key=lambda n: tuned[n]["tokens_per_s"])
    assert row["engineer_by_tuning"] == own
    assert row["by_tuning"]["engineer"]["ratio"] == pytest.approx(eng / rate[own])
    assert row["by_tuning"]["vllm"]["ratio"] == pytest.approx(rate["schedule:vllm"] / rate[own])
    for fmt in ("vllm", "trtllm", "sglang"):  # searched on the run's mix of three workloads
        seeds = json.loads((out / f"{fmt}.json").read_text())["specrl"]["chosen_by"]["seeds"]
        assert seeds == list(range(50_000, 50_000 + stack_search_episodes(3)))
    assert "| ramp | " in (out / "engineer.md").read_text()
    assert f"| ramp | {own} | " in (out / "engineer.md").read_text()
    # --judge-only judges the same files again, without a search: the same figures.
    assert engineer.main([*argv, "--judge-only"]) == 0
    again = json.loads((out / "engineer.json").read_text())
    assert again["rows"] == summary["rows"]
    assert again["searches"] == {} and again["native_searches"] == {}
    (out / "sglang.json").unlink()
    assert engineer.main([*argv, "--judge-only"]) == 2
    err = capsys.readouterr().err
    assert "--judge-only judges the files" in err and "sglang.json is missing" in err


def test_paired_spread_is_the_spread_of_the_per_episode_log_ratio():
    from types import SimpleNamespace

    module = load("paired_spread")
    runs = lambda pairs: [SimpleNamespace(tokens=t, seconds=s) for t, s in pairs]  # noqa: E731
    row = module.paired(runs([(110, 1.0), (90, 1.0)]), runs([(100, 1.0), (100, 1.0)]))
    logs = np.log([1.1, 0.9])
    assert row["ratio"] == pytest.approx(1.0)
    assert row["sd"] == pytest.approx(logs.std(ddof=1))
    assert row["se"] == pytest.approx(logs.std(ddof=1) / np.sqrt(2))
    assert row["spread_alone"] == 0.0


def test_paired_spread_plays_each_schedule_on_the_same_held_out_seeds():
    from specrl.envs import SurrogateSpecEnv, run_episode
    from specrl.policies import FixedK

    module = load("paired_spread")
    result = module.run(module.Args(workloads=("bursts",), episodes=2, seed=7))
    env = SurrogateSpecEnv(workload="bursts")
    rate = {}
    for k in (1, 2):
        played = [run_episode(env, FixedK(k), seed=s) for s in (7, 8)]
        rate[k] = sum(r.tokens for r in played) / sum(r.seconds for r in played)
    row = result["pairs"]["bursts: K=2 / K=1"]
    assert row["ratio"] == pytest.approx(rate[2] / rate[1], rel=1e-12)
    assert set(result["pairs"]) == {f"bursts: {a} / {b}" for a, b in module.PAIRS}


def test_table_headroom_splits_a_buckets_rows_at_one_acceptance():
    """Every split the in-sample search tries sets the bucket's rows, and nothing else, to a
    lower K below the cut and a higher one (at most MAX_STEP more) from it on."""
    from specrl.table.build import table_from_policy
    from specrl.train.search import _NO_PROVENANCE
    from specrl.train.table_search import TableGrid

    module = load("table_headroom")
    edges = [round(i / 100, 2) for i in range(101)]
    table = table_from_policy(
        lambda b, a, c: 2 if b <= 4 else 0,
        k_max=4,
        max_batch=8,
        acceptance_edges=edges,
        provenance=dict(_NO_PROVENANCE),
    )
    grid = TableGrid.of(table)
    trials = module._splits(grid, 3, 4, 4)
    splits = {n: t for n, t in trials.items() if not n.startswith("stale")}
    # 7 cuts x the (low, high) pairs with high - low in 0..2, less the unchanged "2 / 2".
    pairs = sum(1 for lo in range(5) for hi in range(lo, min(4, lo + 2) + 1))
    assert len(splits) == 7 * pairs - 7
    assert {n for n in trials if n.startswith("stale")} == {f"stale K={k}" for k in (0, 1, 3, 4)}
    trial = trials["K=1 below 0.5, K=3 above"]
    assert (trial.k[3:5, :50] == 1).all() and (trial.k[3:5, 50:] == 3).all()
    untouched = np.r_[0:3, 5:9]
    assert (trial.k[untouched] == grid.k[untouched]).all()
    assert (trial.stale == grid.stale).all()


def test_table_headroom_batch_only_reports_what_each_schedule_scores(tmp_path):
    """--batch-only: the searched schedule's and a schedule file's ratios are their tokens/s
    over the engineer's (the better of threshold:tuned and sweep) on the same seeds, scored
    here independently; the search starts from the engineer and keeps only gains."""
    from specrl.envs import SurrogateSpecEnv
    from specrl.policies.engineer import (
        Scorer,
        geometric_rate,
        shared_episodes,
        tune_sweep,
        tune_threshold,
    )

    module = load("table_headroom")
    off = tmp_path / "off.json"
    off.write_text(json.dumps({"num_speculative_tokens_per_batch_size": [[1, 16, 0]]}))
    argv = ["--batch-only", "--workload", "bursts", "--max-batch", "16", "--episodes", "1"]
    argv += ["--fresh-episodes", "1", "--schedule", str(off)]
    with shared_episodes():
        result = module.batch_only(parse(module.Args, argv))
        env = SurrogateSpecEnv(workload="bursts", workload_kwargs={"peak": 16}, max_batch=16)
        engineers = [tune_threshold(env), tune_sweep(env)]
        for column, (seeds, seed) in enumerate((("held-out", 20_000), ("fresh", 60_000))):
            scorer = Scorer([env], [seed])
            engineer = max(geometric_rate(scorer.play_policy(lambda e, p=p: p)) for p in engineers)
            searched = scorer.score(np.array(result["schedule"]))
            assert result["ratios"]["searched in sample"][column] == pytest.approx(
                searched / engineer
            ), seeds
            assert result["ratios"][str(off)][column] == pytest.approx(
                scorer.score(np.zeros(17, dtype=int)) / engineer
            ), seeds
    assert result["ratios"]["searched in sample"][0] >= 1.0
    assert len(result["schedule"]) == 17


def test_row_headroom_likelihood_is_a_distribution_over_accepted_runs():
    """A row that drafts 3 tokens accepts 0, 1, 2 or 3 of them: the four probabilities, worked
    out by hand from the per-position rates, sum to 1 per candidate."""
    module = load("row_headroom")
    rates = np.array([[0.9, 0.5, 0.2], [0.3, 0.6, 0.7]])
    probs = np.exp([module.run_log_likelihood(rates, a, 3) for a in range(4)])  # [runs, cands]
    assert probs[:, 0] == pytest.approx([0.1, 0.9 * 0.5, 0.9 * 0.5 * 0.8, 0.9 * 0.5 * 0.2])
    assert probs[:, 1] == pytest.approx([0.7, 0.3 * 0.4, 0.3 * 0.6 * 0.3, 0.3 * 0.6 * 0.7])
    assert probs.sum(axis=0) == pytest.approx([1.0, 1.0])


def test_row_headroom_posterior_moves_toward_what_the_row_showed():
    """A row that accepted every draft reads a higher survival than the prior; one that
    rejected every first draft, a lower one."""
    from specrl.envs import SurrogateSpecEnv

    module = load("row_headroom")
    env = SurrogateSpecEnv(workload="ramp", workload_kwargs={"peak": 8}, max_batch=8)
    rule = module.RowEstimateRule(env, "per-row")
    group, k = 0, env.k_max
    prior = rule._candidates[group][2]
    rates = rule._rates(group, 10, k)
    good = prior + 5 * module.run_log_likelihood(rates, k, k)
    bad = prior + 5 * module.run_log_likelihood(rates, 0, k)
    base = rule._survival(group, 10, prior)
    assert (rule._survival(group, 10, good) > base).all()
    assert (rule._survival(group, 10, bad) < base).all()


def test_row_headroom_truth_rule_picks_the_oracles_k_at_every_step():
    """The script's rule from the true levels is the myopic oracle: the same K as
    ``SurrogateSpecEnv.oracle_k`` on every step of an episode (levels drifting)."""
    from specrl.envs import SurrogateSpecEnv

    module = load("row_headroom")
    env = SurrogateSpecEnv(workload="ramp", workload_kwargs={"peak": 16}, max_batch=16)
    assert env._level_grid is not None  # the shipped profile's levels drift
    rule = module.RowEstimateRule(env, "truth")
    obs, _ = env.reset(seed=5)
    picked = []
    done = False
    while not done:
        k = int(rule.predict(obs)[0])  # drifts the levels first, as the oracle does
        assert env.oracle_k() == k
        picked.append(k)
        obs, _, terminated, truncated, _ = env.step(k)
        done = terminated or truncated
    assert len(set(picked)) > 1  # the check saw more than one decision


def test_row_headroom_scalar_curve_keeps_the_accepted_per_drafted():
    """The one-figure curve a, a^2, ... drafts as many accepted tokens at K max as the curve it
    stands for, and a curve that is already one figure's comes back unchanged."""
    module = load("row_headroom")
    curve = np.array([0.9, 0.7, 0.45, 0.3])
    flat = module.scalar_survival(curve)
    assert flat.sum() == pytest.approx(curve.sum())
    assert flat[1] == pytest.approx(flat[0] ** 2) and flat[3] == pytest.approx(flat[0] ** 4)
    geometric = 0.8 ** np.arange(1, 5)
    assert module.scalar_survival(geometric) == pytest.approx(geometric)


def test_row_headroom_table_rule_is_the_goodput_formula_on_the_observed_estimate():
    """``table-rule`` picks, at every step, the goodput formula's K at the observation's
    batch, context and acceptance (the per-request estimate), and refuses an env whose
    observation is the step EMA."""
    from specrl.envs import SurrogateSpecEnv
    from specrl.envs.base import ACCEPTANCE, CONTEXT
    from specrl.policies.goodput import Goodput

    module = load("row_headroom")
    kw = {"workload": "ramp", "workload_kwargs": {"peak": 16, "n_requests": 32}, "max_batch": 16}
    env = SurrogateSpecEnv(acceptance_estimate="requests", **kw)
    rule = module.RowEstimateRule(env, "table-rule")
    formula = Goodput(env.profile, max_batch=16, max_len=env.max_len, k_max=env.k_max)
    obs, _ = env.reset(seed=2)
    picked, done = [], False
    while not done:
        k = int(rule.predict(obs)[0])
        batch, row = env._batch_ahead(), obs.astype(np.float64)  # as a policy reads it
        expected = formula.best_k(batch, row[CONTEXT] * env.max_len, row[ACCEPTANCE])
        assert k == (expected if batch else 0)
        picked.append(k)
        obs, _, done, _, _ = env.step(k)
    assert len(set(picked)) > 1
    plain = module.RowEstimateRule(SurrogateSpecEnv(**kw), "table-rule")
    with pytest.raises(ValueError, match="acceptance_estimate='requests'"):
        plain.predict(SurrogateSpecEnv(**kw).reset(seed=2)[0])


def test_row_headroom_table_view_modes_take_away_one_piece_each():
    """``scalar-no-left``, ``scalar-last-context`` and ``scalar-table-view`` hand the oracle's
    rule the same one-figure curve as ``pooled-scalar`` and take away what a table does not
    see: each row's tokens left (every row drafts the full K), the coming step's context (the
    observation's, the last step's, instead), or both."""
    from specrl.envs import SurrogateSpecEnv
    from specrl.envs.base import CONTEXT

    module = load("row_headroom")
    env = SurrogateSpecEnv(workload="ramp", workload_kwargs={"peak": 16}, max_batch=16)
    obs, _ = env.reset(seed=3)
    e = env.unwrapped
    # A step of several rows, one of them near its end (fewer tokens left than K max).
    while not (e._n >= 4 and (e._left[: e._n] <= e.k_max).any()):
        obs, *_ = env.step(2)
    seen = {}
    coming = e._myopic_k
    modes = ("per-row", "pooled-scalar", "scalar-no-left", "scalar-last-context")
    for mode in (*modes, "scalar-table-view", "usable-table-view"):

        def record(survive, left, max_ctx, mode=mode):
            seen[mode] = (survive.copy(), left.copy(), max_ctx)
            return coming(survive, left, max_ctx)

        e._myopic_k = record
        module.RowEstimateRule(env, mode).predict(obs)
    survive, left, ctx = seen["pooled-scalar"]
    assert (left < e.k_max + 1).any() and ctx > 0
    last = min(int(round(float(obs[CONTEXT]) * e.max_len)), e.max_len - 1)
    assert last != ctx  # the coming step's context is not the last step's here
    full = np.full_like(left, e.k_max + 1)
    expected = {
        "scalar-no-left": (full, ctx),
        "scalar-last-context": (left, last),
        "scalar-table-view": (full, last),
    }
    for mode, (want_left, want_ctx) in expected.items():
        got_survive, got_left, got_ctx = seen[mode]
        np.testing.assert_array_equal(got_survive, survive)
        np.testing.assert_array_equal(got_left, want_left)
        assert got_ctx == want_ctx
    # usable-table-view: the table's view, its one figure pooled from each row's curve cut
    # where the row can draft no further (tokens left - 1).
    rows, _, _ = seen["per-row"]
    cut = np.array(
        [[r[j] if j < n - 1 else 0.0 for j in range(e.k_max)] for r, n in zip(rows, left)]
    )
    figure = module.scalar_survival(cut.mean(axis=0))
    got_survive, got_left, got_ctx = seen["usable-table-view"]
    np.testing.assert_allclose(got_survive, np.tile(figure, (len(left), 1)))
    np.testing.assert_array_equal(got_left, full)
    assert got_ctx == last
    assert figure.sum() < survive[0].sum()  # a row near its end lowers the figure


def _mid_episode(workload: str = "bursts", steps: int = 120):
    """A shipped-profile surrogate ``steps`` steps into seed 20,000 under varied Ks."""
    from specrl.envs import SurrogateSpecEnv

    env = SurrogateSpecEnv(workload=workload)
    env.reset(seed=20_000)
    ks = np.random.default_rng(1).integers(0, env.k_max + 1, steps + 200)
    for k in ks[:steps]:
        env.step(int(k))
    return env, [int(k) for k in ks[steps:]]


def _play(env, ks) -> list[tuple[int, float, int]]:
    out = []
    for k in ks:
        _, _, done, _, info = env.step(k)
        out.append((info["committed"], info["step_time_s"], info["accepted"]))
        if done:
            break
    return out


def test_headroom_fork_plays_what_the_env_plays_and_leaves_it_alone():
    module = load("headroom")
    env, ks = _mid_episode()
    twin, _ = _mid_episode()
    forked = _play(module.fork(env), ks[:60])
    assert forked == _play(twin, ks[:60])  # the episode's own draws
    assert _play(env, ks[:60]) == forked  # the env untouched by its fork's steps


def test_headroom_fresh_fork_draws_its_own_acceptance_on_the_same_levels():
    module = load("headroom")
    env, ks = _mid_episode()
    fresh = module.fork(env, np.random.default_rng(3))
    own, other = _play(module.fork(env), ks[:60]), _play(fresh, ks[:60])
    assert [a for _, _, a in own] != [a for _, _, a in other]
    assert fresh._level_path is env._level_path
    again = module.fork(env, np.random.default_rng(3))
    assert _play(again, ks[:60]) == other  # a seed replays
    assert len({round(s / 1e-9) for _, s, _ in other}) > 1


def test_headroom_rollout_seconds_to_a_forks_own_tokens_are_its_steps_seconds():
    module = load("headroom")
    env, _ = _mid_episode()
    k = env.oracle_k()
    tokens = module.rollout_tokens(module.fork(env), k, 8)
    replay, seconds = module.fork(env), 0.0
    action = k
    for _ in range(8):
        _, _, _, _, info = replay.step(action)
        seconds += info["step_time_s"]
        action = replay.oracle_k()
    assert module.rollout_seconds(module.fork(env), k, tokens, 32) == pytest.approx(seconds)
    half = module.rollout_seconds(module.fork(env), k, tokens // 2, 32)
    assert 0 < half < seconds


def test_headroom_clairvoyant_lookahead_chooses_the_k_that_commits_fastest():
    module = load("headroom")
    env, _ = _mid_episode()
    oracle = module.LookaheadOracle(env, horizon=4, clairvoyant=True)
    base = env.oracle_k()
    goal = module.rollout_tokens(module.fork(env), base, 4)
    times = [module.rollout_seconds(module.fork(env), k, goal, 16) for k in range(env.k_max + 1)]
    chosen, _ = oracle.predict(env._get_obs(), episode_start=np.array([False]))
    assert int(chosen) == int(np.argmin(times))


def test_headroom_script_judges_the_oracles_against_the_engineer(tmp_path):
    module = load("headroom")
    out = module.run(
        module.Args(workloads=("bursts",), episodes=1, horizon=2, samples=1, out=str(tmp_path))
    )
    data = json.loads((out / "headroom.json").read_text())
    (row,) = data["rows"]
    assert row["engineer"] in ("threshold:tuned", "sweep")
    for name in module.ORACLES:
        assert row[name]["ratio"] > 0.5
    best = max(row[name]["ratio"] for name in module.ORACLES[:3])
    assert row["headroom"] == pytest.approx(best - 1)
    assert "clairvoyant lookahead" in (out / "headroom.md").read_text()


def test_headroom_share_is_given_only_over_a_headroom_of_note():
    module = load("headroom")
    assert module.native_share(1.005, 0.01) == pytest.approx(0.5)
    assert module.native_share(0.998, 0.004) == pytest.approx(-0.5)
    assert module.native_share(0.9977, 1e-6) is None  # a near-zero headroom: no share
    assert module.native_share(1.0, -0.0026) is None
    assert module.native_share(1.0005, module.MIN_SHARED_HEADROOM) == pytest.approx(0.5)


def test_headroom_oracle_and_engineer_is_either_where_its_buckets_say():
    from specrl.envs import SurrogateSpecEnv, run_episode
    from specrl.features import BUCKET_LABELS
    from specrl.policies import BatchThreshold, Oracle

    module = load("headroom")
    env = SurrogateSpecEnv(workload="bursts")
    engineer = BatchThreshold(3, 8, env.max_batch)
    rate = lambda policy: run_episode(env, policy, seed=5).tokens_per_s  # noqa: E731
    assert rate(module.OracleAndEngineer(env, engineer)) == rate(Oracle(env))
    everywhere = module.OracleAndEngineer(env, engineer, BUCKET_LABELS)
    assert rate(everywhere) == rate(engineer)
    assert rate(module.OracleAndEngineer(env, engineer, ["2-4"])) not in (
        rate(Oracle(env)),
        rate(engineer),
    )
    assert everywhere.labels() == list(BUCKET_LABELS)


def test_headroom_oracle_and_engineer_is_tuned_on_seeds_a_comparison_refuses():
    from specrl.compare import compare_policies
    from specrl.envs import SurrogateSpecEnv
    from specrl.features import BUCKET_LABELS
    from specrl.policies import BatchThreshold
    from specrl.seeds import TUNE_SEED

    module = load("headroom")
    env = SurrogateSpecEnv(workload="bursts", workload_kwargs={"peak": 16}, max_batch=16)
    hybrid = module.tune_oracle_and_engineer(env, BatchThreshold(3, 8, env.max_batch))
    assert hybrid.tuning.seeds == list(range(TUNE_SEED, TUNE_SEED + module.TUNE_EPISODES))
    scores = hybrid.tuning.scores
    # Each round adds the bucket or range that gains most, and only where it gains: what it
    # keeps is the best it tried; the range from one row up (the engineer everywhere) is
    # tried in the first round.
    assert hybrid.tuning.tokens_per_s == max(scores.values())
    assert scores[", ".join(hybrid.labels()) or "none"] == hybrid.tuning.tokens_per_s
    assert {"none", "1", ", ".join(BUCKET_LABELS)} <= set(scores)
    with pytest.raises(SpecrlError, match="tuned on seeds"):
        compare_policies(env, [hybrid], seed=TUNE_SEED + 1, episodes=1, progress=False)
