"""``specrl export``: a trained run as a K table, its fidelity check, the vLLM and TensorRT-LLM
files, and ``lookup:TABLE.json`` (:class:`LookupPolicy`) played in the surrogate."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from train_helpers import tiny

from specrl.cli import main
from specrl.controller import LookupController
from specrl.envs import SurrogateSpecEnv
from specrl.envs.training import PROBE
from specrl.errors import SpecrlError
from specrl.policies import LookupPolicy, make_policy
from specrl.policies.ppo import PPOPolicy
from specrl.profile.synthetic import linear_profile
from specrl.table import load_table, table_from_json
from specrl.table.build import monotone_in_acceptance
from specrl.train import train
from specrl.train.search import stack_search_episodes
from specrl.train.to_table import (
    ACCEPTANCE_EDGES,
    REQUEST_ACCEPTANCE_EDGES,
    UNVISITED_WEIGHT,
    check_fidelity,
    checked_table,
    play_policy,
    table_from_run,
    visited_cells,
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export")
    profile = root / "linear.json"
    linear_profile().save(profile)
    config = tiny(root / "run", profile, eval_workloads=("ramp", "steady-8"), eval_every=0)
    train(config, progress=False)
    return Path(config.out)


def surrogate(run_dir: Path, workload: str = "ramp") -> SurrogateSpecEnv:
    from specrl.config import load_config

    config = load_config(run_dir)
    return SurrogateSpecEnv(
        profile=config.profile,
        workload=workload,
        workload_kwargs={"peak": 8, "n_requests": 8},
        k_max=config.k_max,
        max_batch=8,
        max_len=config.max_len,
    )


def _bucket(table, batch: int) -> int:
    return next(i for i, (lo, hi) in enumerate(table.batch_buckets) if lo <= batch <= hi)


def test_table_holds_the_policys_k_at_every_batch_size_and_bin_midpoint(run_dir):
    raw = table_from_run(run_dir)
    table = table_from_run(run_dir, monotone=True)
    policy = PPOPolicy.load(run_dir)
    assert (table.k_max, table.max_batch) == (4, 8)
    assert table.acceptance_edges == list(ACCEPTANCE_EDGES)
    # DEFAULT_PROBE_SCOPE, at the profile's mean acceptance unless told
    typical = round(float(np.mean(linear_profile().mean_acceptance)), 4)
    assert table.probe == {**PROBE, "scope": "operating", "acceptance": typical}
    operating = table_from_run(run_dir, probe_acceptance=0.55).probe
    assert operating == {**PROBE, "scope": "operating", "acceptance": 0.55}
    assert table_from_run(run_dir, probe_scope="all").probe == {**PROBE, "scope": "all"}
    spec = table_from_run(run_dir, probe_scope="speculating", probe_acceptance=0.55).probe
    assert spec == {**PROBE, "scope": "speculating"}
    with pytest.raises(SpecrlError, match="probe scope"):
        table_from_run(run_dir, probe_scope="never")
    mids = [(lo + hi) / 2 for lo, hi in zip(ACCEPTANCE_EDGES, ACCEPTANCE_EDGES[1:])]
    changed = 0
    visits = visited_cells(run_dir)  # the policy's own episodes, seeds from VISIT_SEED
    assert visits.sum() > 0 and not visits[0].any()
    for batch in range(1, 9):
        want = policy.decide(np.full(len(mids), batch), np.asarray(mids), np.zeros(len(mids)))
        assert raw.cell(_bucket(raw, batch)) == want.tolist()
        # With monotone, each batch size's Ks are the closest non-decreasing ones, by visits.
        row = table.cell(_bucket(table, batch))
        weights = (visits[batch] + UNVISITED_WEIGHT).tolist()
        assert row == monotone_in_acceptance(want.tolist(), 4, weights) and row == sorted(row)
        changed += sum(x != y for x, y in zip(row, want.tolist()))
        for t in (raw, table):
            assert t.stale(_bucket(t, batch)) == int(policy.decide([batch], [0.0], [True])[0])
    assert table.provenance["monotone_cells_changed"] == changed
    assert table.provenance["monotone_visits"] == int(visits.sum())
    assert "monotone_cells_changed" not in raw.provenance
    prov = table.provenance
    assert prov["training_steps"] == 512 and prov["run_id"] == str(run_dir.resolve())
    assert prov["profile_fingerprint"] == linear_profile().fingerprint


def test_export_refuses_a_run_trained_with_another_k_max(run_dir, monkeypatch):
    with pytest.raises(SpecrlError, match="trained with k_max=4, not 3"):
        table_from_run(run_dir, k_max=3)

    def played(*args, **kwargs):
        raise AssertionError("episodes played before the run was refused")

    monkeypatch.setattr("specrl.train.to_table.play_policy", played)
    with pytest.raises(SpecrlError, match="trained with k_max=4, not 3"):
        checked_table(run_dir, k_max=3, progress=False)
    with pytest.raises(SpecrlError, match=r"--acceptance must be a number in \[0, 1\], got 1\.5"):
        checked_table(run_dir, acceptance=1.5, progress=False)


def test_fidelity_replays_recorded_policy_episodes_and_checks_the_table_fits(run_dir):
    """check_fidelity on episodes recorded by play_policy equals one that plays them itself;
    a table of another k_max than the run's is refused."""
    table = table_from_run(run_dir)
    runs = play_policy(run_dir, episodes=1, progress=False)
    assert list(runs.steps) == ["ramp", "steady-8"] and runs.seeds == [20_000]
    own = check_fidelity(run_dir, table, episodes=1, progress=False)
    replayed = check_fidelity(run_dir, table, progress=False, policy_runs=runs)
    assert own.to_json() == replayed.to_json()
    assert own.mean_acceptance == runs.mean_acceptance
    narrow = table_from_run(run_dir, probe_scope="all").to_json()
    narrow["k_max"] = 3
    narrow["k"] = [[min(k, 3) for k in row] for row in narrow["k"]]
    narrow["stale_k"] = [min(k, 3) for k in narrow["stale_k"]]
    with pytest.raises(SpecrlError, match="drafts up to K=3 but .* k_max=4"):
        check_fidelity(run_dir, table_from_json(narrow), episodes=1, progress=False)


def test_unchecked_export_still_probes_at_the_policys_mean_estimate(run_dir):
    """Without the fidelity check the policy's own episodes still set the operating
    acceptance, so --no-check writes the same probe rule as a checked export."""
    table, fidelity = checked_table(run_dir, check=False, episodes=1, progress=False)
    mean = round(play_policy(run_dir, episodes=1, progress=False).mean_acceptance, 4)
    assert fidelity is None and "fidelity" not in table.provenance
    assert table.probe["acceptance"] == table.provenance["operating_acceptance"] == mean
    told, _ = checked_table(run_dir, check=False, acceptance=0.25, progress=False)
    assert told.probe["acceptance"] == told.provenance["operating_acceptance"] == 0.25


def test_fidelity_counts_the_states_where_the_table_picks_the_policys_k(run_dir):
    table = table_from_run(run_dir)
    fidelity = check_fidelity(run_dir, table, episodes=1, progress=False)
    assert fidelity.states > 0 and set(fidelity.by_workload) == {"ramp", "steady-8"}
    # A table that differs from the policy everywhere matches nowhere (probes aside).
    wrong = table_from_run(run_dir)
    wrong.k = [[(k + 1) % 5 for k in row] for row in wrong.k]
    wrong.stale_k = [(k + 1) % 5 for k in wrong.stale_k]
    worse = check_fidelity(run_dir, wrong, episodes=1, progress=False)
    assert worse.match < 0.05
    assert fidelity.match >= 0.99


def test_lookup_policy_acts_as_the_controller_driven_by_hand(run_dir, tmp_path):
    """The policy sets the controller's tracker from the observation; a controller fed the
    step's drafted and accepted counts must choose the same K at every step, including
    the probe, which needs the count of steps past the observation's saturation."""
    table = table_from_run(run_dir)
    table.k = [[0] * len(row) for row in table.k]  # K=0 everywhere: only probes draft
    table.stale_k = [0] * len(table.stale_k)
    table.probe = {"after_steps": 40, "k": 2}
    env = surrogate(run_dir, "steady-8")
    policy = LookupPolicy(table, max_batch=8, k_max=4)
    by_hand = LookupController(table)
    obs, _ = env.reset(seed=3)
    start, ks = True, []
    for _ in range(200):
        k, _ = policy.predict(obs, episode_start=np.array([start]))
        start = False
        assert int(k) == by_hand.choose_k(env.unwrapped._batch_ahead())
        obs, _, done, _, info = env.step(k)
        by_hand.observe(info["drafted"], info["accepted"])
        ks.append(int(k))
        if done:
            break
    assert ks.count(2) >= 2 and set(ks) == {0, 2}
    assert ks[:42] == [2] + [0] * 40 + [2]  # nothing measured yet: the first step probes


def test_compare_runs_lookup_and_ppo_by_name(run_dir, tmp_path):
    out = tmp_path / "table.json"
    # --force: on 8-request episodes one differing step reshuffles every later draw, so the
    # tokens/s ratio of the check is noise here (match is what this test needs). --no-search:
    # the learned table itself, which the policy is compared with.
    args = ["export", "--run", str(run_dir), "--out", str(out), "--no-progress", "--force"]
    args.append("--no-search")
    assert main(args) == 0
    env = surrogate(run_dir)
    lookup = make_policy(f"lookup:{out}", env=env)
    ppo = make_policy(f"ppo:{run_dir}", env=env)
    from specrl.envs.rollout import run_episode

    a, b = run_episode(env, lookup, seed=5), run_episode(env, ppo, seed=5)
    assert a.tokens == b.tokens > 0  # every request commits its max_new_tokens
    # Both read the same observations: the table picks the policy's K on (almost) every one
    # of the policy's own states; one step apart reshuffles the draws, so the two episodes
    # are not compared step by step.
    obs, _ = env.reset(seed=5)
    done, start, same, steps = False, True, 0, 0
    while not done:
        first = np.array([start])
        k, _ = ppo.predict(obs, episode_start=first)
        same += int(lookup.predict(obs, episode_start=first)[0] == k)
        obs, _, done, _, _ = env.step(k)
        start, steps = False, steps + 1
    assert same / steps >= 0.95
    with pytest.raises(SpecrlError, match="drafts up to K=4 but the env's k_max is 2"):
        LookupPolicy(out, max_batch=8, k_max=2)


def test_lookup_refuses_a_table_made_for_other_hardware_unless_forced(run_dir, tmp_path):
    out = tmp_path / "table.json"
    table = table_from_run(run_dir)
    table.provenance["profile_fingerprint"] = {
        **linear_profile().fingerprint,
        "device": "cuda:H200",
    }
    table.save(out)
    env = surrogate(run_dir)
    with pytest.raises(SpecrlError, match="other hardware"):
        make_policy(f"lookup:{out}", env=env)
    with pytest.warns(UserWarning, match="other hardware"):
        make_policy(f"lookup:{out}", env=env, force=True)


def test_export_cli_writes_native_vllm_and_trtllm(run_dir, tmp_path, capsys):
    native = tmp_path / "t.json"
    args = ["export", "--run", str(run_dir), "--out", str(native), "--no-progress", "--force"]
    assert main(args) == 0  # --force: see test_compare_runs_lookup_and_ppo_by_name
    captured = capsys.readouterr()
    printed = captured.out
    assert "fidelity: the table picks PPO's K" in printed and "monotone" not in printed
    versus = load_table(native).provenance["against_engineer"]
    assert versus["ratio"] == pytest.approx(
        versus["table_tokens_per_s"] / versus["engineer_tokens_per_s"]
    )
    assert versus["seeds"] == list(range(50_000, 50_008)) and versus["workloads"] == [
        "ramp",
        "steady-2",
        "steady-8",
    ]
    assert f"({versus['ratio']:.4f}x)" in printed
    below = "the table is below the engineer's per-bucket sweep" in captured.err
    assert below == (versus["ratio"] < 0.99)
    mono = tmp_path / "m.json"
    assert main([*args[:4], str(mono), "--no-progress", "--force", "--monotone"]) == 0
    assert " of 800 cells changed from the policy's K" in capsys.readouterr().out
    assert load_table(mono).provenance["monotone_visits"] > 0
    table = load_table(native)
    assert 0 < table.provenance["operating_acceptance"] <= 1
    assert table.provenance["fidelity"]["match"] >= 0.99
    # The probe looks where the vLLM file collapses: the policy's mean fresh estimate.
    mean = table.provenance["fidelity"]["mean_acceptance"]
    assert table.probe["scope"] == "operating"
    assert table.probe["acceptance"] == table.provenance["operating_acceptance"] == round(mean, 4)
    told = tmp_path / "told.json"
    assert main([*args[:4], str(told), "--no-progress", "--force", "--acceptance", "0.3"]) == 0
    assert load_table(told).probe["acceptance"] == 0.3
    assert load_table(told).provenance["operating_acceptance"] == 0.3
    capsys.readouterr()
    vllm = tmp_path / "v.json"
    assert main(["export", "--table", str(native), "--format", "vllm", "--out", str(vllm)]) == 0
    obj = json.loads(vllm.read_text())
    config = obj["speculative_config"]
    assert config["num_speculative_tokens"] == 4
    ranges = config["num_speculative_tokens_per_batch_size"]
    assert ranges[0][0] == 1 and ranges[-1][1] == 8
    assert all(r[1] + 1 == s[0] for r, s in zip(ranges, ranges[1:]))
    column = table.acceptance_bin(table.provenance["operating_acceptance"])
    for lo, hi, k in ranges:
        for batch in range(lo, hi + 1):
            b = next(i for i, (a, z) in enumerate(table.batch_buckets) if a <= batch <= z)
            assert table.cell(b)[column] == k
    assert obj["specrl"]["acceptance"] == table.provenance["operating_acceptance"]


def test_export_of_a_missing_or_unfinished_run_is_a_clear_error(tmp_path, run_dir, capsys):
    out = tmp_path / "t.json"
    assert main(["export", "--run", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert "not found; train one" in capsys.readouterr().err and not out.exists()
    a_file = tmp_path / "model.zip"
    a_file.write_bytes(b"")
    assert main(["export", "--run", str(a_file), "--out", str(out)]) == 2
    assert f"{a_file} is a file, not a run directory" in capsys.readouterr().err
    assert not out.exists()
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.json").write_text((run_dir / "config.json").read_text())
    assert main(["export", "--run", str(unfinished), "--out", str(out)]) == 2
    assert "has not finished" in capsys.readouterr().err and not out.exists()


def test_export_of_a_per_request_run_carries_the_estimate_a_controller_computes(
    tmp_path, run_dir, capsys
):
    """A run on ``acceptance_estimate="usable"`` exports a native table that names its
    estimate and carries the profile's candidates and curves, so a serving controller computes
    the figure itself; the block is the profile's, bucket for bucket."""
    import json
    import shutil

    from specrl.controller import LookupController
    from specrl.envs.request_acceptance import request_block
    from specrl.posterior import RequestTracker
    from specrl.train.trained import TrainedRun

    other = tmp_path / "usable-run"
    shutil.copytree(run_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["acceptance_estimate"] = "usable"
    (other / "config.json").write_text(json.dumps(config))
    out = tmp_path / "t.json"
    assert main(["export", "--run", str(other), "--out", str(out), "--no-search"]) == 0
    table = load_table(out)
    assert table.provenance["acceptance_estimate"] == "usable"
    assert table.acceptance_edges == list(REQUEST_ACCEPTANCE_EDGES)  # 0.005 wide
    run = TrainedRun.load(other)
    assert table.request_acceptance == request_block(run.profile, table.k_max)
    controller = LookupController.load(out)
    assert isinstance(controller.requests, RequestTracker) and controller.requests.usable
    with pytest.raises(SpecrlError, match="requests.observe"):
        controller.observe(4, 2)


def test_export_refuses_a_table_that_does_not_reproduce_the_policy(
    run_dir, tmp_path, monkeypatch, capsys
):
    """The fidelity gate, without --force: every K of the table is one off the policy's."""
    import specrl.train.to_table as export

    original = export.table_from_run

    def shifted(*args, **kwargs):
        table = original(*args, **kwargs)
        obj = table.to_json()
        top = table.k_max + 1
        obj["k"] = [[(k + 1) % top for k in row] for row in obj["k"]]
        obj["stale_k"] = [(k + 1) % top for k in obj["stale_k"]]
        return table_from_json(obj)

    monkeypatch.setattr(export, "table_from_run", shifted)
    for fmt in ("native", "vllm", "sglang"):
        out = tmp_path / f"{fmt}.json"
        argv = ["export", "--run", str(run_dir), "--out", str(out), "--format", fmt]
        assert main([*argv, "--no-progress", "--episodes", "1"]) == 2
        err = capsys.readouterr().err
        # Only the probe rule's steps can still agree: far below the 99% goal.
        assert re.search(
            rf"does not reproduce {re.escape(str(run_dir))}'s policy \(match [0-4]\.", err
        )
        assert "nothing written. Pass --force to write it anyway" in err
        assert not out.exists()


def test_export_cli_searches_each_stack_format(run_dir, tmp_path, capsys):
    from specrl.policies import BatchSchedule

    for fmt in ("vllm", "trtllm", "sglang"):
        out = tmp_path / f"{fmt}.json"
        argv = ["export", "--run", str(run_dir), "--out", str(out), "--format", fmt]
        assert main([*argv, "--no-progress", "--force", "--workload", "ramp"]) == 0
        printed = capsys.readouterr().out
        episodes = stack_search_episodes(1)  # 32 for one workload, more than the engineer's
        last = 50_000 + episodes - 1
        assert f"{fmt}: searched from " in printed and f"judged on seeds 50000-{last} of ramp" in (
            printed
        )
        obj = json.loads(out.read_text())
        chosen = obj["specrl"]["chosen_by"]
        assert chosen["method"] == "search" and chosen["workloads"] == ["ramp"]
        incumbent = chosen["incumbent"]  # the engineer's sweep or threshold, as compare tunes it
        assert incumbent in chosen["starts"] and ("sweep" in incumbent or "threshold" in incumbent)
        assert chosen["confirm_seeds"] == list(range(55_000, 55_000 + episodes))
        assert chosen["score"] >= chosen["starts"][incumbent]  # never below it on either set
        assert chosen["score_confirm"] >= chosen["starts_confirm"][incumbent]
        assert f"confirmed on seeds 55000-{last + 5_000}: score " in printed
        assert all(r["worth"] >= 0.005 for r in chosen["rises"])
        schedule = BatchSchedule.from_file(out, max_batch=8, k_max=4)
        assert schedule.table[1:, 0].tolist()  # the stack's reading of what was written
    plain = tmp_path / "plain.json"
    argv = ["export", "--run", str(run_dir), "--out", str(plain), "--format", "vllm"]
    assert main([*argv, "--no-progress", "--force", "--no-search"]) == 0
    assert "collapsed at acceptance" in capsys.readouterr().out
    assert "chosen_by" not in json.loads(plain.read_text())["specrl"]


def test_export_cli_searches_the_native_table_from_the_learned_one(run_dir, tmp_path, capsys):
    base = ["export", "--run", str(run_dir), "--no-progress", "--force"]
    searched, learned = tmp_path / "searched.json", tmp_path / "learned.json"
    assert main([*base, "--out", str(searched), "--workload", "ramp,steady-8"]) == 0
    printed = capsys.readouterr().out
    assert "native: searched from the " in printed
    assert "judged on seeds 50000-50007, confirmed on 55000-55007, of ramp, steady-8" in printed
    table = load_table(searched)
    chosen = table.provenance["chosen_by"]
    assert set(chosen["starts"]) == {"learned table", "engineer's sweep", "engineer's threshold"}
    assert chosen["score"] >= chosen["starts"]["engineer's sweep"]
    assert chosen["confirm_seeds"] == list(range(55_000, 55_008))  # NATIVE_EPISODES
    assert table.provenance["fidelity"]["match"] >= 0.99  # the learned table's check
    # The check against the engineer is on the training mix, whatever --workload searched.
    assert table.provenance["against_engineer"]["workloads"] == ["ramp", "steady-2", "steady-8"]
    assert main([*base, "--out", str(learned), "--no-search"]) == 0
    assert "native: searched" not in capsys.readouterr().out
    plain = load_table(learned)
    assert "chosen_by" not in plain.provenance
    assert plain.to_json()["k"] == table_from_run(run_dir).to_json()["k"]


def test_search_episodes_set_the_seeds_every_search_and_the_check_play(run_dir, tmp_path, capsys):
    base = ["export", "--run", str(run_dir), "--no-progress", "--force", "--workload", "ramp"]
    vllm = tmp_path / "vllm.json"
    assert main([*base, "--out", str(vllm), "--format", "vllm", "--search-episodes", "3"]) == 0
    assert "judged on seeds 50000-50002 of ramp:" in capsys.readouterr().out
    assert json.loads(vllm.read_text())["specrl"]["chosen_by"]["seeds"] == [50_000, 50_001, 50_002]
    native = tmp_path / "native.json"
    assert main([*base, "--out", str(native), "--search-episodes", "1"]) == 0
    assert "judged on seeds 50000-50000, confirmed on 55000-55000, of ramp" in (
        capsys.readouterr().out
    )
    provenance = load_table(native).provenance
    assert provenance["chosen_by"]["seeds"] == [50_000]
    assert provenance["chosen_by"]["confirm_seeds"] == [55_000]
    assert provenance["against_engineer"]["seeds"] == [50_000]
    # A --table is converted, not searched: the option is refused by name, nothing written.
    again = tmp_path / "again.json"
    argv = ["export", "--table", str(native), "--out", str(again), "--search-episodes", "3"]
    assert main([*argv, "--format", "vllm"]) == 2
    assert "--search-episodes: this acts on tabulating a run" in capsys.readouterr().err
    assert not again.exists()
    with pytest.raises(SystemExit):
        main([*base, "--out", str(again), "--search-episodes", "0"])
    assert "--search-episodes" in capsys.readouterr().err


def test_export_refuses_stack_options_for_other_formats(run_dir, tmp_path, capsys):
    out = tmp_path / "t.json"
    base = ["export", "--run", str(run_dir), "--out", str(out)]
    assert main([*base, "--format", "vllm", "--cuda-graph-bs", "1,2,4"]) == 2
    assert "--cuda-graph-bs: SGLang's CUDA-graph sizes" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse's own refusal, exit 2
        main([*base, "--format", "sglang", "--cuda-graph-bs", "1,x"])
    assert "expected batch sizes >= 1" in capsys.readouterr().err
    assert not out.exists()


def test_export_warns_when_the_table_is_below_the_engineer(run_dir, tmp_path, monkeypatch, capsys):
    versus = {
        "table_tokens_per_s": 90.0,
        "engineer_tokens_per_s": 100.0,
        "ratio": 0.9,
        "engineer": "sweep",
        "workloads": ["ramp"],
        "seeds": [50_000, 50_001],
    }
    monkeypatch.setattr("specrl.train.search.against_engineer", lambda run, table: versus)
    out = tmp_path / "t.json"
    argv = [
        *("export", "--run", str(run_dir), "--out", str(out), "--no-progress", "--force"),
        "--no-search",
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "against the engineer: the table 90.0 tokens/s" in captured.out
    assert "the table is below the engineer's per-bucket sweep on the tuning seeds (0.9000x)" in (
        captured.err
    )
    assert load_table(out).provenance["against_engineer"] == versus


def test_a_per_request_runs_table_is_read_with_its_own_estimate(tmp_path, run_dir, capsys):
    """A table exported from a run whose observation was the ``usable`` figure records it in
    its provenance; its fidelity shadow reads that figure (as the table is served in such an
    env), and a controller fed another figure, the serving stack's step EMA above all,
    refuses the table rather than read its bins with the wrong number."""
    import shutil

    other = tmp_path / "usable-run"
    shutil.copytree(run_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["acceptance_estimate"] = "usable"
    (other / "config.json").write_text(json.dumps(config))
    table = table_from_run(other)
    assert table.provenance["acceptance_estimate"] == "usable"
    assert "acceptance_estimate" not in table_from_run(run_dir).provenance
    fidelity = check_fidelity(other, table, episodes=1, progress=False)
    assert fidelity.states > 0 and fidelity.match >= 0.99
    with pytest.raises(SpecrlError, match="trained on the 'usable' acceptance estimate"):
        LookupController(table, acceptance_estimate="steps")
    LookupController(table, acceptance_estimate="usable")
    assert LookupController(table).requests is not None  # it computes the figure itself
    bare = table.to_json()
    del bare["request_acceptance"]
    with pytest.raises(SpecrlError, match="has no 'request_acceptance' field"):
        LookupController(table_from_json(bare))
    path = tmp_path / "t.json"
    table.save(path)
    env = surrogate(run_dir)
    with pytest.raises(SpecrlError, match="trained on the 'usable' acceptance estimate"):
        make_policy(f"lookup:{path}", env=env)  # this env observes the step EMA
    usable = SurrogateSpecEnv(
        profile=env.profile, workload="ramp", max_batch=8, acceptance_estimate="usable"
    )
    assert make_policy(f"lookup:{path}", env=usable).acceptance_estimate == "usable"
    # specrl compare builds its env with the table's estimate, and refuses another.
    from specrl.config import load_config

    compare = ["compare", "--workload", "ramp", "--n-requests", "8", "--max-batch", "8"]
    compare += ["--episodes", "1", "--policies", f"off,lookup:{path}"]
    compare += ["--profile", str(load_config(run_dir).profile)]
    assert main([*compare, "--acceptance-estimate", "steps"]) == 2
    assert (
        "--acceptance-estimate steps: the lookup: tables and ppo: runs compared were "
        "trained on 'usable'" in capsys.readouterr().err
    )
    assert main([*compare, "--acceptance-estimate", "usable"]) == 0
    usable_out = capsys.readouterr().out
    assert main(compare) == 0
    assert capsys.readouterr().out == usable_out  # the same comparison, on the same draws
    bad = table.to_json()
    bad["provenance"]["acceptance_estimate"] = "ema"
    with pytest.raises(SpecrlError, match=r"provenance'?\.acceptance_estimate: expected one of"):
        table_from_json(bad)


def test_a_comparison_takes_the_estimate_its_trained_policies_read(tmp_path, run_dir, capsys):
    """``trained_estimate``: the acceptance estimate of the ``lookup:`` tables and ``ppo:``
    runs compared (the step EMA where none is named), and a SpecrlError naming each where
    they differ: one env's observation holds one figure. A ``ppo:`` run is refused in an env
    of another estimate, as a table is."""
    import shutil

    from specrl.config import load_config
    from specrl.policies.registry import observation_estimate, trained_estimate

    other = tmp_path / "usable-run"
    shutil.copytree(run_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["acceptance_estimate"] = "usable"
    (other / "config.json").write_text(json.dumps(config))
    steps_table, usable_table = tmp_path / "steps.json", tmp_path / "usable.json"
    table_from_run(run_dir).save(steps_table)
    table_from_run(other).save(usable_table)

    assert trained_estimate(["off", "sweep"]) == "steps"
    assert trained_estimate(["off"], default="requests") == "requests"
    assert trained_estimate([f"lookup:{steps_table}", f"ppo:{run_dir}"]) == "steps"
    assert trained_estimate(["off", f"lookup:{usable_table}", f"ppo:{other}"]) == "usable"
    both = r"different acceptance estimates: .*steps\.json \(steps\), .*usable-run \(usable\)"
    with pytest.raises(SpecrlError, match=both):
        trained_estimate([f"lookup:{steps_table}", f"ppo:{other}"])

    assert observation_estimate([f"lookup:{usable_table}"], None) == "usable"
    assert observation_estimate(["off"], None) == "steps"
    assert observation_estimate(["off"], "requests") == "requests"
    with pytest.raises(SpecrlError, match="--acceptance-estimate steps: .* trained on 'usable'"):
        observation_estimate(["off", f"ppo:{other}"], "steps")
    # validate-surrogate refuses it before it loads the pair or builds an env.
    validate = ["validate-surrogate", "--profile", str(load_config(run_dir).profile)]
    validate += ["--policies", f"off,lookup:{usable_table}", "--acceptance-estimate", "steps"]
    assert main(validate) == 2
    assert "trained on 'usable'" in capsys.readouterr().err

    # A warm start from a table of the other figure is refused before the run writes anything.
    profile = Path(load_config(run_dir).profile)
    fresh = tiny(
        tmp_path / "warm",
        profile,
        warm_start=f"lookup:{steps_table}",
        acceptance_estimate="usable",
    )
    with pytest.raises(
        SpecrlError,
        match=r"--warm-start lookup:.*steps\.json was trained on the 'steps' acceptance "
        r"estimate, and this run observes 'usable'; pass --acceptance-estimate steps",
    ):
        train(fresh, progress=False)
    assert not (tmp_path / "warm").exists()

    env = surrogate(run_dir)  # the step EMA
    with pytest.raises(SpecrlError, match="trained with acceptance_estimate=usable.*build the env"):
        make_policy(f"ppo:{other}", env=env)
    usable = SurrogateSpecEnv(
        profile=env.profile, workload="ramp", max_batch=8, acceptance_estimate="usable"
    )
    assert make_policy(f"ppo:{other}", env=usable).name == "ppo"
