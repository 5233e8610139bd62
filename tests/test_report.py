"""Reports: the wandb comparison dashboards read back from the offline run files, and the
PNG plots (tokens/s per bucket, K table heatmap, K over time, training curve)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from wandb_reader import read_run

from specrl.compare import compare_policies
from specrl.envs import SurrogateSpecEnv
from specrl.errors import SpecrlError
from specrl.features import BUCKET_LABELS
from specrl.policies import make_policy
from specrl.profile.synthetic import linear_profile
from specrl.report import (
    comparison_table,
    load_evaluations,
    log_comparison,
    plot_buckets,
    plot_k_over_time,
    plot_table,
    plot_training,
    policy_metrics,
)
from specrl.report.plots import (
    buckets_figure,
    k_over_time_figure,
    table_figure,
    training_figure,
)
from specrl.table import KTable, provenance

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _report(workload: str, specs: list[str]):
    env = SurrogateSpecEnv(
        profile=linear_profile(),
        workload=workload,
        workload_kwargs={"n_requests": 24, "peak": 8},
        max_batch=8,
    )
    policies = [make_policy(s, env=env) for s in specs]
    return compare_policies(
        env, policies, seed=3, episodes=1, env_name="surrogate", workload=workload, progress=False
    )


@pytest.fixture(scope="module")
def report():
    return _report("ramp", ["off", "fixed:2", "goodput", "oracle"])


@pytest.fixture(autouse=True)
def wandb_offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def _is_png(path: Path) -> bool:
    data = Path(path).read_bytes()
    return len(data) > len(PNG_SIGNATURE) and data.startswith(PNG_SIGNATURE)


def _same(logged, expected: float) -> bool:
    """wandb keeps floats exactly; a NaN summary value is stored as null."""
    return logged is None if math.isnan(expected) else logged == expected


def _table_fields(**changes) -> dict:
    fields = dict(
        k_max=4,
        max_batch=64,
        batch_buckets=[[1, 8], [9, 32], [33, 64]],
        acceptance_edges=[0.0, 0.4, 0.7, 1.0],
        k=[[1, 3, 4], [0, 2, 3], [0, 0, 1]],
        stale_k=[0, 1, 0],
        probe={"after_steps": 32, "k": 1},
        provenance=provenance(
            profile_sha256="0" * 64,
            profile_fingerprint={"device": "cpu"},
            target_id="t",
            draft_id="d",
            run_id="r",
            training_steps=0,
        ),
    )
    return fields | changes


# ----------------------------------------------------------------------------- metrics


def test_policy_metrics_hold_the_same_keys_with_the_reports_numbers(report):
    off, k2, oracle = report.result("off"), report.result("K=2"), report.result("oracle")
    keys = [list(policy_metrics(report, r)) for r in report.results]
    assert all(k == keys[0] for k in keys)
    assert keys[0][:1] + keys[0][-2:] == ["tokens_per_s", "tpot_p50_s", "tpot_p99_s"]
    assert [f"bucket/{b}/tokens_per_s" for b in BUCKET_LABELS] == keys[0][1:8]
    m = policy_metrics(report, k2)
    assert m["tokens_per_s"] == k2.tokens_per_s and m["tpot_p99_s"] == k2.tpot_p99_s
    assert m["k_share/2"] == 1.0 and m["k_share/0"] == 0.0
    assert m["ratio/off"] == k2.tokens_per_s / off.tokens_per_s
    assert m["ratio/oracle"] == k2.tokens_per_s / oracle.tokens_per_s
    assert m["ratio/best_static"] == k2.tokens_per_s / report.best_static.tokens_per_s
    assert math.isnan(m["bucket/65-128/tokens_per_s"])  # max_batch 8: never reached
    for label, rate in k2.bucket_tokens_per_s.items():
        assert m[f"bucket/{label}/tokens_per_s"] == rate
    columns, rows = comparison_table(report)
    assert columns == ["policy", *keys[0]]
    assert [row[0] for row in rows] == ["off", "K=2", "goodput", "oracle"]


# ----------------------------------------------------------------------------- wandb


def test_log_comparison_offline_runs_read_back(report, tmp_path):
    extra = plot_table(KTable(**_table_fields()), tmp_path / "table.png")
    [logged] = log_comparison(
        report, group="exp1", out_dir=tmp_path, plots={"table": extra}, config={"note": "x"}
    )
    assert logged.group == "exp1"
    assert list(logged.policy_runs) == ["off", "K=2", "goodput", "oracle"]
    run_dirs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert sorted([*logged.policy_runs.values(), logged.summary_run]) == run_dirs

    summary_keys = None
    for result in report.results:
        run = read_run(logged.policy_runs[result.policy])
        assert (run.name, run.group, run.job_type) == (result.policy, "exp1", "policy")
        assert run.config["policy"] == result.policy and run.config["note"] == "x"
        assert (run.config["env"], run.config["workload"], run.config["seed"]) == (
            "surrogate",
            "ramp",
            3,
        )
        metrics = policy_metrics(report, result)
        for key, value in metrics.items():
            assert key in run.summary, key
            assert _same(run.summary[key], value), (result.policy, key, run.summary[key], value)
        assert run.summary["tokens_per_s"] == result.tokens_per_s
        logged_keys = {k for k in run.summary if not k.startswith("_")}
        assert summary_keys is None or logged_keys == summary_keys  # the same keys everywhere
        summary_keys = logged_keys
        assert "by_bucket/batch" not in logged_keys
        curve = run.columns()
        assert curve["by_bucket/tokens_per_s"] == [
            result.bucket_tokens_per_s[b] for b in BUCKET_LABELS if b in result.bucket_tokens_per_s
        ]
        largest = {"1": 1, "2-4": 4, "5-8": 8}
        assert curve["by_bucket/batch"] == [
            largest[b] for b in BUCKET_LABELS if b in result.bucket_tokens_per_s
        ]
    oracle = read_run(logged.policy_runs["oracle"])
    assert oracle.summary["ratio/oracle"] == 1.0

    summary = read_run(logged.summary_run)
    assert (summary.name, summary.group, summary.job_type) == ("summary", "exp1", "summary")
    assert summary.config["policies"] == ["off", "K=2", "goodput", "oracle"]
    assert summary.summary["comparison/_type"] == "table-file"
    files = logged.summary_run / "files"
    table = json.loads((files / summary.summary["comparison/path"]).read_text())
    columns, rows = comparison_table(report)
    assert table["columns"] == columns
    assert len(table["data"]) == len(rows) == 4
    for got, want in zip(table["data"], rows):
        assert got[0] == want[0]
        assert all(
            (math.isnan(w) and math.isnan(g)) if math.isnan(w) else g == w
            for g, w in zip(got[1:], want[1:])
        )
    for name in ("buckets", "table"):
        assert summary.summary[f"plots/{name}/_type"] == "image-file"
        assert _is_png(files / summary.summary[f"plots/{name}/path"])
    assert _is_png(tmp_path / "plots" / "exp1-buckets.png")


def test_several_reports_get_a_group_each_and_nan_for_a_missing_reference(report, tmp_path):
    steady = _report("steady-4", ["off", "fixed:2"])  # no oracle ran
    groups = log_comparison([report, steady], group="exp2", out_dir=tmp_path)
    assert [g.group for g in groups] == ["exp2-surrogate-ramp", "exp2-surrogate-steady-4"]
    ramp_run = read_run(groups[0].policy_runs["off"])
    steady_run = read_run(groups[1].policy_runs["off"])
    assert steady_run.group == "exp2-surrogate-steady-4"
    assert steady_run.summary["ratio/oracle"] is None  # NaN: the oracle did not run
    assert steady_run.summary["ratio/off"] == 1.0
    assert ramp_run.summary["ratio/oracle"] > 0
    same = {k for k in ramp_run.summary if not k.startswith("_")}
    assert same == {k for k in steady_run.summary if not k.startswith("_")}


def test_log_comparison_refuses_bad_arguments_and_disabled_writes_nothing(report, tmp_path):
    with pytest.raises(SpecrlError, match="'cloud' is not one of offline, online, disabled"):
        log_comparison(report, group="g", out_dir=tmp_path, mode="cloud")
    with pytest.raises(SpecrlError, match="share the group"):
        log_comparison([report, report], group="g", out_dir=tmp_path)
    with pytest.raises(SpecrlError, match="not found"):
        log_comparison(report, group="g", out_dir=tmp_path, plots={"x": tmp_path / "no.png"})
    out = tmp_path / "disabled"
    [logged] = log_comparison(report, group="g", out_dir=out, mode="disabled")
    assert logged.summary_run is None and set(logged.policy_runs.values()) == {None}
    assert not [p for p in out.rglob("*") if p.is_file()]  # wandb may make the folder


# ----------------------------------------------------------------------------- plots


def test_plot_buckets_draws_one_line_per_policy(report, tmp_path):
    path = plot_buckets(report, tmp_path / "sub" / "buckets.png")
    assert path == tmp_path / "sub" / "buckets.png" and _is_png(path)
    ax = buckets_figure(report).axes[0]
    reached = [b for b in BUCKET_LABELS if any(b in r.bucket_tokens_per_s for r in report.results)]
    assert [t.get_text() for t in ax.get_xticklabels()] == reached
    assert [line.get_label() for line in ax.lines] == [r.policy for r in report.results]
    for line, result in zip(ax.lines, report.results):
        want = [result.bucket_tokens_per_s.get(b, math.nan) for b in reached]
        assert list(line.get_ydata()) == pytest.approx(want, nan_ok=True)


def test_plot_table_draws_every_cell_with_its_k(tmp_path):
    table = KTable(**_table_fields())
    assert _is_png(plot_table(table, tmp_path / "table.png"))
    ax = table_figure(table).axes[0]
    expected = [[0, 1, 3, 4], [1, 0, 2, 3], [0, 0, 0, 1]]  # stale K, then by acceptance
    assert ax.images[0].get_array().tolist() == expected
    assert [t.get_text() for t in ax.texts] == [str(k) for row in expected for k in row]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1-8", "9-32", "33-64"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["stale", "0-0.4", "0.4-0.7", "0.7-1"]

    by_context = KTable(
        **_table_fields(
            context_bins=[[1, 256], [257, None]],
            k=[[[1, 3, 4], [0, 1, 2]], [[0, 2, 3], [0, 0, 1]], [[0, 0, 1], [0, 0, 0]]],
            stale_k=[[0, 0], [1, 0], [0, 0]],
        )
    )
    panels = [ax for ax in table_figure(by_context).axes if ax.images]
    assert [ax.get_title() for ax in panels] == ["context 1-256", "context 257+"]
    assert panels[1].images[0].get_array().tolist() == [[0, 0, 1, 2], [0, 0, 0, 1], [0, 0, 0, 0]]
    assert _is_png(plot_table(by_context, tmp_path / "by_context.png"))


def test_plot_table_of_an_exported_size_stays_readable(tmp_path):
    edges = [round(i / 100, 2) for i in range(101)]
    buckets = [[b, b] for b in range(1, 129)]
    k = [[min(4, (b + j) // 40) for j in range(100)] for b in range(128)]
    table = KTable(
        **_table_fields(
            batch_buckets=buckets,
            acceptance_edges=edges,
            k=k,
            stale_k=[0] * 128,
            max_batch=128,
        )
    )
    fig = table_figure(table)
    ax = fig.axes[0]
    assert ax.images[0].get_array().shape == (128, 101)
    assert len(ax.texts) == 0  # 12,928 cells: no K written in each
    width, height = fig.get_size_inches()
    assert width <= 16 and height <= 11
    xs = [t.get_text() for t in ax.get_xticklabels()]
    assert xs[:3] == ["stale", "0.1-0.11", "0.2-0.21"] and len(xs) <= 12
    ys = [t.get_text() for t in ax.get_yticklabels()]
    assert ys[:2] == ["1", "5"] and len(ys) <= 32
    assert _is_png(plot_table(table, tmp_path / "big.png"))


def test_plot_k_over_time_draws_k_and_batch_on_the_serving_clock(report, tmp_path):
    episode = report.result("goodput").episodes[0]
    assert _is_png(plot_k_over_time(episode, tmp_path / "k.png", title="goodput on ramp"))
    fig = k_over_time_figure(episode)
    k_axis, batch_axis = fig.axes
    ks = k_axis.patches[0].get_data()
    assert ks.values.tolist() == episode.step_k
    assert ks.edges[0] == 0.0 and ks.edges[-1] == pytest.approx(episode.seconds)
    assert batch_axis.patches[0].get_data().values.tolist() == episode.step_batch
    with pytest.raises(SpecrlError, match="differ in length"):
        k_over_time_figure(dataclasses.replace(episode, step_k=episode.step_k[:-1]))


def test_plot_training_reads_evaluations_objects_dicts_and_run_dirs(tmp_path):
    from specrl.train import TrainConfig
    from specrl.train.evaluate import Evaluation

    config = TrainConfig(
        out=str(tmp_path / "run"),
        max_batch=8,
        n_requests=8,
        eval_workloads=("ramp", "steady-4"),
    )
    evaluation = Evaluation(config, linear_profile())
    results = [
        evaluation.run(make_policy(spec, env=evaluation.envs["ramp"]), steps)
        for spec, steps in (("fixed:1", 256), ("goodput", 512))
    ]
    assert _is_png(plot_training(results, tmp_path / "training.png"))
    axes = training_figure(results).axes
    assert [ax.get_title() for ax in axes] == ["ramp", "steady-4"]
    for ax, name in zip(axes, ("ramp", "steady-4")):
        policy, best, oracle = ax.lines
        assert list(policy.get_xdata()) == [256, 512]
        assert list(policy.get_ydata()) == [r.by_workload[name]["tokens_per_s"] for r in results]
        assert list(best.get_ydata()) == [
            r.by_workload[name]["best_static_tokens_per_s"] for r in results
        ]
        assert list(oracle.get_ydata()) == [
            r.by_workload[name]["oracle_tokens_per_s"] for r in results
        ]
        assert best.get_label().startswith("best static (")

    run_dir = tmp_path / "run"
    state = run_dir / "checkpoints" / "step-000000000512" / "state.json"
    state.parent.mkdir(parents=True)
    history = [r.to_json() for r in results]
    state.write_text(json.dumps({"eval_history": history[:1]}))
    assert load_evaluations(run_dir) == history[:1]  # a run in progress: its checkpoint
    (run_dir / "summary.json").write_text(json.dumps({"eval_history": history}))
    assert load_evaluations(run_dir) == history  # a finished run: its summary
    assert _is_png(plot_training(run_dir, tmp_path / "from_dir.png"))
    with pytest.raises(SpecrlError, match="no evaluations"):
        plot_training(tmp_path / "empty", tmp_path / "x.png")
    with pytest.raises(SpecrlError, match="no evaluations to plot"):
        training_figure([])
