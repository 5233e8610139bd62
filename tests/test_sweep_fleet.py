"""Fleet profiling on a local Ray whose one node has two custom CPU resources, standing for two
accelerator types: each kind profiles itself, and the profiles come back to the driver naming
the machine that measured them."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import ray

from specrl.errors import SpecrlError
from specrl.profile import load_profile
from specrl.sweep.fleet import FleetJob, profile_fleet

KINDS = ("accel_a", "accel_b")
TINY = {
    "batch_sizes": [1],
    "contexts": [16],
    "reps": 1,
    "k_max": 2,
    "acceptance_rows": 1,
    "acceptance_tokens": 8,
}


# First in the file: the other tests share one Ray session, and this one needs none started.
def test_bad_jobs_are_refused_before_ray_starts(tmp_path):
    assert not ray.is_initialized()
    with pytest.raises(SpecrlError, match="unknown preset 'tiny'"):
        FleetJob("accel_a", preset="tiny")
    with pytest.raises(SpecrlError, match="give preset .* or target and draft"):
        FleetJob("accel_a")
    with pytest.raises(SpecrlError, match=r"unknown grid setting\(s\) repetitions"):
        FleetJob("accel_a", preset="micro", grid={"repetitions": 1})
    with pytest.raises(SpecrlError, match="contexts must increase"):
        FleetJob("accel_a", preset="micro", grid={"contexts": [64, 16]})
    with pytest.raises(SpecrlError, match="by must be one of resource, accelerator_type"):
        FleetJob("accel_a", preset="micro", by="gpu")
    twice = [FleetJob("accel:H200", preset="micro"), FleetJob("accel_H200", preset="micro")]
    with pytest.raises(SpecrlError, match="more than one job writes profile-micro-accel_H200"):
        profile_fleet(twice, tmp_path)
    with pytest.raises(SpecrlError, match="--address 127.0.0.1:9: no Ray cluster answers there"):
        profile_fleet([FleetJob("accel_a", preset="micro")], tmp_path, address="127.0.0.1:9")


@pytest.fixture(scope="module")
def two_kinds(micro_pair_paths):
    """A local Ray with one resource per accelerator kind; its workers find the micro pair
    under the session's SPECRL_HOME (``HOME/pairs/micro/target``)."""
    home = Path(micro_pair_paths.target_path).parents[2]
    ray.init(
        num_cpus=2,
        resources={kind: 1 for kind in KINDS},
        include_dashboard=False,
        runtime_env={"env_vars": {"SPECRL_HOME": str(home)}},
    )
    yield
    ray.shutdown()


def test_a_kind_no_node_has_is_refused_before_anything_runs(two_kinds, tmp_path):
    jobs = [
        FleetJob("accel_a", preset="micro", grid=TINY),
        FleetJob("H200", preset="micro", by="accelerator_type"),
    ]
    with pytest.raises(
        SpecrlError,
        match=r"H200: no node of the Ray cluster has \{CPU: 1, accelerator_type:H200: 0.001, "
        r"GPU: 1\} \(its nodes' accelerator resources: accel_a, accel_b\)",
    ):
        profile_fleet(jobs, tmp_path)
    too_wide = FleetJob("accel_b", preset="micro", threads=3, grid=TINY)
    with pytest.raises(SpecrlError, match=r"micro on accel_b: no node .* \{CPU: 3, accel_b: 1\}"):
        profile_fleet([too_wide], tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_job_that_fails_on_its_node_is_named_and_the_others_finish(two_kinds, tmp_path):
    missing = tmp_path / "nowhere"
    jobs = [
        FleetJob("accel_a", preset="micro", grid=TINY),
        FleetJob("accel_b", target=str(missing / "t"), draft=str(missing / "d"), grid=TINY),
    ]
    with pytest.raises(SpecrlError) as refused:
        profile_fleet(jobs, tmp_path)
    written = tmp_path / "profile-micro-accel_a.json"
    assert str(refused.value) == (
        f"fleet profiling: 1 of 2 job(s) failed: fleet job {missing}/t / {missing}/d on "
        f"accel_b: specrl.errors.SpecrlError: target directory {missing}/t does not exist; "
        f"build it (specrl models build) or give a Hugging Face model id; written: {written}"
    )
    assert load_profile(written).meta["fleet"]["accelerator"] == "accel_a"


def test_jobs_not_finished_in_time_are_cancelled_and_named(two_kinds, tmp_path):
    jobs = [FleetJob("accel_b", preset="micro", grid=TINY)]
    with pytest.raises(
        SpecrlError, match=r"not finished after 0.01 s, cancelled: fleet job micro on accel_b"
    ):
        profile_fleet(jobs, tmp_path, timeout_s=0.01)


@pytest.mark.slow  # about 30 s: a profile per kind, then a sweep on each
def test_a_sweep_measures_its_fleet_profiles_then_trains_a_table_on_each(two_kinds, tmp_path):
    """Each accelerator kind profiles itself, the profile comes back to the driver naming the
    machine that measured it, and a table is trained on each."""
    from test_sweep import TINY_TRAIN, write_spec

    from specrl.cli import main

    grid = {**TINY, "batch_sizes": [1, 8]}
    spec = {
        "fleet": [{"accelerator": kind, "preset": "micro", "grid": grid} for kind in KINDS],
        "workloads": [["ramp", "steady-2", "steady-8"]],
        "train": {**TINY_TRAIN, "k_max": 2},
        "compare": {"workloads": ["ramp"], "episodes": 1},
        "export": {"search": False},
        "wandb": "disabled",
    }
    path = write_spec(tmp_path / "fleet.yaml", spec)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == []
    names = [f"profile-micro-{kind}" for kind in KINDS]
    assert [row["profile"] for row in summary["configurations"]] == names
    assert sorted(summary["best"]) == [f"{n}-ramp+steady-2+steady-8" for n in names]
    node_id = ray.get_runtime_context().get_node_id()
    for kind, name in zip(KINDS, names, strict=True):
        profile_file = out / "profiles" / f"{name}.json"
        profile = load_profile(profile_file)
        assert profile.batch_sizes == [1, 8] and profile.k_max == 2
        assert profile.fingerprint["device"].startswith("cpu")
        assert profile.meta["preset"] == "micro"
        # Each kind profiled itself: placed by its own kind's resource and no other's, on
        # the node the profile names.
        fleet = profile.meta["fleet"]
        assert (fleet["accelerator"], fleet["scheduled_by"], fleet["resource"]) == (
            kind,
            "resource",
            kind,
        )
        assert fleet["assigned"][kind] == 1
        assert not set(fleet["assigned"]) & (set(KINDS) - {kind})
        assert (fleet["hostname"], fleet["node_id"]) == (socket.gethostname(), node_id)
        record = json.loads(
            (out / "trials" / f"{name}-ramp+steady-2+steady-8-s0" / "metrics.json").read_text()
        )
        assert record["trial"]["profile"] == str(profile_file)
        assert record["training"] == "trained"
    # Resumed, the profiles measured already are kept, not measured again.
    stamps = {p: p.stat().st_mtime_ns for p in (out / "profiles").iterdir()}
    assert main(["sweep", str(path), "--out", str(out), "--resume"]) == 0
    assert {p: p.stat().st_mtime_ns for p in (out / "profiles").iterdir()} == stamps
