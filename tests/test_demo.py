"""``specrl demo`` end to end on the micro pair at a tiny budget: every step runs, every
artifact is written and readable, and a second run reuses the profile and the training."""

from __future__ import annotations

import json

import pytest

from specrl.pipeline import DemoOptions, run_demo
from specrl.table import load_table

pytestmark = pytest.mark.slow  # 2-5 minutes on 2 cores; run with `pytest -m slow`


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    options = DemoOptions(
        out=str(root),
        preset="micro",
        timesteps=512,
        surrogate_episodes=1,
        live_requests=4,
        max_batch=8,
        n_requests=8,
        wandb="offline",
        progress=False,
    )
    return run_demo(options), run_demo(options)


def test_demo_writes_every_artifact(demos):
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
        assert names[0] == "off" and "oracle" in names and names[-1] == "lookup:table.json"
    live = json.loads((run / "compare-live-mixed.json").read_text())
    names = [r["policy"] for r in live["results"]]
    assert names[0] == "off" and "goodput" in names and names[-1] == "lookup:table.json"
    assert all(r["tokens_per_s"] > 0 for r in live["results"])
    for png in ("buckets-live", "buckets-surrogate-mixed", "table", "training", "k-over-time-ramp"):
        assert (run / f"{png}.png").read_bytes()[:4] == b"\x89PNG"
    assert len(summary["wandb_groups"]) == 5
    assert list((run / "wandb").glob("offline-run-*"))


def test_a_second_demo_reuses_the_profile_and_the_training(demos):
    first, second = demos
    summary = json.loads((second.run_dir / "demo.json").read_text())
    assert summary["profile_how"] == "reused" and summary["training"] == "reused"
    assert second.profile_path == first.profile_path and second.train_dir == first.train_dir
    assert second.run_dir != first.run_dir
