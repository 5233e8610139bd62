"""``specrl demo`` end to end on the micro pair at a tiny budget: every step runs, every
artifact is written and readable, the tables are printed, and a second run reuses the profile
and the training. One run with a tiny profile is in the default suite; the runs that measure
the demo's own profile are marked slow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specrl.demo import (
    DEMO_EVAL_EPISODES,
    DEMO_NATIVE_EPISODES,
    DEMO_WARM_START_EPISODES,
    SURROGATE_WORKLOADS,
    DemoOptions,
    cached_profile_path,
    run_demo,
)
from specrl.table import load_table

PLOTS = ("buckets-live", "buckets-surrogate-mixed", "table", "training", "k-over-time-ramp")
"""The PNG plots a demo writes into its run folder."""


def _micro_demo(out: Path, *, max_batch: int) -> DemoOptions:
    """The demo on the micro pair at the smallest budget that still runs every stage."""
    return DemoOptions(
        out=str(out),
        preset="micro",
        timesteps=512,
        surrogate_episodes=1,
        live_requests=4,
        max_batch=max_batch,
        n_requests=8,
        wandb="offline",
        progress=False,
    )


def test_demo_writes_every_artifact_and_prints_the_tables(
    micro_pair, micro_pair_paths, tmp_path, monkeypatch, capsys
):
    """The whole job at a tiny budget, about 45 s on 2 cores: the micro pair, a profile
    measured here at a tiny grid (batch 1-2, one repetition, 2 acceptance rows) and left in
    the demo's cache as an earlier demo leaves one, PPO for one rollout (2,048 steps), batches
    up to 2."""
    from specrl.config import CONFIG_FILE, SUMMARY_FILE, TrainConfig
    from specrl.profile import pair_fingerprint
    from specrl.profile.measure import measure_profile
    from specrl.train.search import NATIVE_EPISODES, SEARCH_EPISODES

    home = Path(micro_pair_paths.target_path).parents[2]  # HOME/pairs/micro/target
    monkeypatch.setenv("SPECRL_HOME", str(home))  # the demo builds nothing: it is built there
    cached = cached_profile_path(pair_fingerprint(micro_pair, k_max=4), tmp_path / "demo-cache")
    measure_profile(
        micro_pair,
        k_max=4,
        batch_sizes=(1, 2),
        contexts=(16, 64),
        reps=1,
        acceptance_rows=2,
        acceptance_tokens=40,
        progress=False,
    ).save(cached)
    options = _micro_demo(tmp_path, max_batch=2)
    result = run_demo(options)
    printed = capsys.readouterr().out
    run = result.run_dir
    summary = json.loads((run / "demo.json").read_text())
    assert (summary["profile_how"], result.profile_path) == ("reused", cached)
    assert summary["training"] == "trained" and (result.train_dir / SUMMARY_FILE).is_file()
    # The demo's budget: its warm start clones the oracle on fewer episodes than specrl train.
    trained = json.loads((result.train_dir / CONFIG_FILE).read_text())
    assert trained["warm_start_episodes"] == DEMO_WARM_START_EPISODES == 4
    assert TrainConfig().warm_start_episodes == 16
    # ... picks its model on one evaluation episode a workload, not specrl train's four ...
    assert trained["eval_episodes"] == DEMO_EVAL_EPISODES == 1
    assert TrainConfig().eval_episodes == 4
    # ... and searches its native table on two episodes a workload, not specrl export's eight.
    chosen_by = load_table(run / "table.json").provenance["chosen_by"]
    assert len(chosen_by["seeds"]) == len(chosen_by["confirm_seeds"]) == DEMO_NATIVE_EPISODES
    assert DEMO_NATIVE_EPISODES == 2 < NATIVE_EPISODES == SEARCH_EPISODES == 8
    assert result.train_dir.parent == tmp_path / "demo-cache"
    # The default observation, each request's usable figure: the table carries what its
    # controller computes it from, and the live comparison served it with that figure.
    assert trained["acceptance_estimate"] == TrainConfig().acceptance_estimate == "usable"
    native = load_table(run / "table.json")
    assert native.provenance["acceptance_estimate"] == "usable"
    assert native.request_acceptance is not None

    reports = [f"surrogate-{w}" for w in SURROGATE_WORKLOADS] + ["live-mixed"]
    exports = []
    for fmt in ("vllm", "trtllm", "sglang"):  # either written or said why not
        written = (run / f"table-{fmt}.json").is_file()
        assert written != (f"  {fmt}: not written: " in printed), fmt
        exports += [f"table-{fmt}.json"] if written else []
    assert sorted(p.name for p in run.iterdir()) == sorted(
        ["demo.json", "table.json", *exports, "plots", "wandb"]
        + [f"compare-{r}.{ext}" for r in reports for ext in ("json", "csv")]
        + [f"{name}.png" for name in PLOTS]
    )
    assert load_table(run / "table.json").max_batch == 2
    assert sorted(p.name for p in (run / "plots").iterdir()) == sorted(
        f"{run.name}-{r}-buckets.png" for r in reports
    )
    for png in [run / f"{name}.png" for name in PLOTS] + list((run / "plots").iterdir()):
        assert png.read_bytes()[:4] == b"\x89PNG", png
    results = {r: json.loads((run / f"compare-{r}.json").read_text())["results"] for r in reports}
    # wandb: a run per policy and a summary run per comparison, in a group each.
    assert summary["wandb_groups"] == [f"{run.name}-{r}" for r in reports]
    runs = list((run / "wandb").glob("offline-run-*"))
    assert len(runs) == sum(len(policies) + 1 for policies in results.values())
    assert summary["artifacts"]["wandb runs"] == str(run / "wandb")

    live = [r["policy"] for r in results["live-mixed"]]
    assert json.loads((run / "compare-live-mixed.json").read_text())["interleaved"] is True
    # Live: off, the engineer and the table (the other baselines run in the surrogate only).
    assert live == ["off", live[1], "lookup:table.json"]
    assert live[1] in ("threshold:tuned", "sweep")
    surrogate = printed.index("surrogate, workload mixed, 1 held-out episodes:\n| policy |")
    at_live = printed.index(
        "live on this machine, 2 held-out mixed traces of 4 requests, the policies side by side:\n"
    )
    live_printed = printed[at_live : printed.index(f"wrote {run}/:")]
    assert surrogate < at_live
    for name in live:
        assert f"\n| {name} | " in live_printed
    for row in results["surrogate-mixed"]:
        assert f"\n| {row['policy']} | " in printed[surrogate:at_live]
    assert "best static policy, among off, K=1, K=2, K=3, K=4: " in printed[surrogate:at_live]
    assert "the engineer: " in printed[surrogate:at_live]
    # No K ran live beside off, so the live table names no best static policy.
    assert "best static policy" not in live_printed
    for fmt in exports:  # each written schedule was searched and compared
        chosen = json.loads((run / fmt).read_text())["specrl"]["chosen_by"]
        assert chosen["method"] == "search" and chosen["score"] >= max(chosen["starts"].values())
        assert f"\n| schedule:{fmt.removesuffix('.json')} | " in printed[surrogate:at_live]


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    options = _micro_demo(root, max_batch=8)
    return run_demo(options), run_demo(options)


@pytest.mark.slow  # 2-5 minutes on 2 cores, the demo's own profile measured
def test_demo_measures_its_profile_and_writes_every_artifact(demos):
    first, _ = demos
    run = first.run_dir
    summary = json.loads((run / "demo.json").read_text())
    assert summary["profile_how"] == "measured"  # the shipped profile is the small pair's
    assert summary["training"] == "trained"
    table = load_table(run / "table.json")
    assert table.max_batch == 8 and table.k_max == 4
    vllm = json.loads((run / "table-vllm.json").read_text())["speculative_config"]
    assert vllm["num_speculative_tokens"] == 4
    for workload in ("ramp", "day", "bursts", "mixed"):
        report = json.loads((run / f"compare-surrogate-{workload}.json").read_text())
        names = [r["policy"] for r in report["results"]]
        assert names[0] == "off" and "oracle" in names and "lookup:table.json" in names
        assert {"threshold:tuned", "sweep", "schedule:table-vllm"} <= set(names)
    live = json.loads((run / "compare-live-mixed.json").read_text())
    names = [r["policy"] for r in live["results"]]
    assert names == ["off", names[1], "lookup:table.json"]
    assert all(r["tokens_per_s"] > 0 for r in live["results"])
    for png in ("buckets-live", "buckets-surrogate-mixed", "table", "training", "k-over-time-ramp"):
        assert (run / f"{png}.png").read_bytes()[:4] == b"\x89PNG"
    assert len(summary["wandb_groups"]) == 5
    assert list((run / "wandb").glob("offline-run-*"))


@pytest.mark.slow
def test_a_second_demo_reuses_the_profile_and_the_training(demos):
    first, second = demos
    summary = json.loads((second.run_dir / "demo.json").read_text())
    assert summary["profile_how"] == "reused" and summary["training"] == "reused"
    assert second.profile_path == first.profile_path and second.train_dir == first.train_dir
    assert second.run_dir != first.run_dir
