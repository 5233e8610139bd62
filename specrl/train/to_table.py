"""``specrl export``: a trained PPO run as the K table a serving stack reads, checked against
the policy it came from.

* :func:`table_from_run`: the run's deterministic K at every batch size ``1..max_batch``,
  every acceptance bin and the stale entry, as a :class:`~specrl.table.KTable` with the run's
  provenance. The network reads exactly what the table indexes
  (:mod:`specrl.policies.ppo`), so nothing is collapsed but acceptance, into bins. With
  ``monotone``, each batch size's Ks are then made non-decreasing in the acceptance estimate
  (:func:`specrl.table.build.monotone_in_acceptance`), weighted by how often the policy met
  each cell in its own surrogate episodes (seeds from :data:`specrl.seeds.VISIT_SEED`, apart
  from the fidelity check's): the fidelity check measures what that changed.
* :func:`check_fidelity`: on held-out seeds of the surrogate, the share of visited states
  where the table's controller picks the policy's K, and the table's tokens/s over the
  policy's.

stable-baselines3 and torch load with the run's model, inside functions.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specrl.controller import LookupController
from specrl.envs.request_acceptance import request_block
from specrl.errors import SpecrlError
from specrl.seeds import HELD_OUT_SEED, VISIT_SEED
from specrl.table import PROBE_SCOPES, KTable, check_acceptance, provenance
from specrl.table.build import table_from_policy
from specrl.train.trained import TrainedRun, as_run

ACCEPTANCE_EDGES = tuple(round(i / 100, 2) for i in range(101))
"""Acceptance bins of an exported table: 0.01 wide. The fidelity check reports how often the
binning changes the policy's K (docs/stacks.md: what finer and coarser bins cost)."""
REQUEST_ACCEPTANCE_EDGES = tuple(round(i / 200, 3) for i in range(201))
"""Acceptance bins of a table of a run on a per-request estimate: 0.005 wide. That figure
moves in small steps, and the policy's K changes often within a 0.01 bin of it."""


def export_edges(config) -> tuple[float, ...]:
    """The acceptance bins a run of ``config`` (its ``acceptance_estimate``) exports."""
    steps = config.acceptance_estimate == "steps"
    return ACCEPTANCE_EDGES if steps else REQUEST_ACCEPTANCE_EDGES


FIDELITY_SEED = HELD_OUT_SEED
"""Check episode ``i`` is reset with ``FIDELITY_SEED + i`` (:mod:`specrl.seeds`)."""
DEFAULT_PROBE_SCOPE = "operating"
"""The exported probe rule's ``scope``, with the table's operating acceptance (see
:func:`checked_table`): probe only at batch sizes where the table has a K > 0 in some
acceptance bin up to the one holding that acceptance. Training probes at every batch size
(:data:`specrl.envs.training.PROBE`). A probe after a long stretch at K=0 pays the draft's
catch-up on every token every row skipped; where the table runs off at every estimate, a
probe cannot change its K, so the table skips it there (docs/stacks.md: the three scopes
measured). The fidelity check counts each probe the table skips (and the policy makes) as a
mismatch."""
FIDELITY_EPISODES = 4
"""Fidelity check episodes per evaluation workload: one state where the table and the network
differ can move the rest of an episode, so the ratio over fewer episodes is noisy."""
UNVISITED_WEIGHT = 1e-3
"""A cell the policy never met counts this much against a visit: among the monotone tables
that change the fewest visits, the one changing the fewest cells."""
MIN_MATCH = 0.99
MIN_RATIO = 0.99
BELOW_ENGINEER = 0.99
"""A native table below this share of the engineer's sweep on the tuning seeds is warned
about: a gap under 1% is one two seeds per workload do not tell from noise."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def table_from_run(
    run_dir: TrainedRun | str | Path,
    *,
    k_max: int | None = None,
    acceptance_edges=None,
    monotone: bool = False,
    episodes: int = 2,
    progress: bool = False,
    probe_scope: str = DEFAULT_PROBE_SCOPE,
    probe_acceptance: float | None = None,
) -> KTable:
    """The K table of ``run_dir``'s policy, ``model.zip`` (see the module).

    :param k_max: the K the serving engine drafts at most, if known: a run trained with
        another ``k_max`` is refused (its actions mean other Ks).
    :param acceptance_edges: the table's acceptance bins; None: :func:`export_edges`.
    :param monotone: make each batch size's Ks non-decreasing in the acceptance estimate,
        weighted by the cells the policy visits in ``episodes`` surrogate episodes of each of
        its evaluation workloads; False: the policy's K in every cell as it is.
    :param probe_scope: the probe rule's ``scope`` (:data:`specrl.table.PROBE_SCOPES`; see
        :data:`DEFAULT_PROBE_SCOPE`).
    :param probe_acceptance: with the scope "operating", the acceptance it probes at; None:
        the profile's mean acceptance (:func:`checked_table` passes the one the policy
        observed).
    """
    _check_probe_scope(probe_scope)  # before the model loads
    run = as_run(run_dir, k_max)
    config, steps = run.config, run.steps
    if probe_acceptance is not None:
        check_acceptance(probe_acceptance, "probe_acceptance")
    policy = run.policy
    profile, profile_path = run.profile, run.profile_path
    edges = list(export_edges(config) if acceptance_edges is None else acceptance_edges)
    points = [(lo + hi) / 2 for lo, hi in zip(edges, edges[1:])]
    batches = np.arange(1, config.max_batch + 1)
    grid = policy.decide(
        np.repeat(batches[:, None], len(points), axis=1),
        np.tile(np.asarray(points)[None, :], (len(batches), 1)),
        np.zeros((len(batches), len(points)), dtype=bool),
    )  # [batch - 1, acceptance bin]
    stale = policy.decide(batches, np.zeros(len(batches)), np.ones(len(batches), dtype=bool))
    fp = profile.fingerprint
    prov = provenance(
        profile_sha256=_sha256(profile_path),
        profile_fingerprint=fp,
        target_id=str(fp.get("target_id", "")),
        draft_id=str(fp.get("draft_id", "")),
        run_id=str(run.run_dir.resolve()),
        training_steps=steps,
        profile_path=str(profile_path),
        workloads=list(config.workloads),
    )
    block = None
    if config.acceptance_estimate != "steps":  # the figure its acceptance bins are read with
        prov["acceptance_estimate"] = config.acceptance_estimate
        block = request_block(profile, config.k_max)  # so that a controller computes it too
    weights = None
    if monotone:
        visits = visited_cells(run, edges, episodes=episodes, progress=progress)
        prov["monotone_visits"] = int(visits.sum())

        def weights(batch: int, context: int) -> list[float]:
            return (visits[batch] + UNVISITED_WEIGHT).tolist()

    return table_from_policy(
        lambda b, a, c: int(grid[b - 1, bisect_right(edges, a) - 1]),
        stale_decide=lambda b, c: int(stale[b - 1]),
        k_max=config.k_max,
        max_batch=config.max_batch,
        acceptance_edges=edges,
        provenance=prov,
        probe=probe_rule(probe_scope, probe_acceptance, profile),
        monotone=monotone,
        monotone_weights=weights,
        request_acceptance=block,
    )


def _check_probe_scope(scope: str) -> None:
    if scope not in PROBE_SCOPES:
        raise SpecrlError(f"probe scope must be one of {', '.join(PROBE_SCOPES)}, got {scope!r}")


def profile_acceptance(profile) -> float:
    """The profile's mean acceptance, rounded to 4 places: the operating point of a table
    exported without a fidelity check."""
    return round(float(np.mean(profile.mean_acceptance)), 4)


def probe_rule(scope: str, acceptance: float | None, profile) -> dict:
    """The exported probe rule: the policy's (:data:`specrl.envs.training.PROBE`) with
    ``scope``; the scope "operating" probes at ``acceptance`` (None: the profile's mean)."""
    from specrl.envs.training import PROBE

    rule = {**PROBE, "scope": scope}
    if scope == "operating":
        rule["acceptance"] = profile_acceptance(profile) if acceptance is None else acceptance
    return rule


def visited_cells(
    run_dir: TrainedRun | str | Path,
    acceptance_edges=ACCEPTANCE_EDGES,
    *,
    episodes: int = 2,
    seed: int = VISIT_SEED,
    progress: bool = False,
    desc: str = "monotone: visits",
) -> np.ndarray:
    """``[batch, acceptance bin]`` counts (rows ``0..max_batch``) of the steps where the
    run's policy, playing ``episodes`` surrogate episodes of each evaluation workload, read
    a fresh acceptance estimate (staleness below 1) at that batch size and bin."""
    from tqdm.auto import tqdm

    from specrl.envs.base import ACCEPTANCE, STALENESS

    run = as_run(run_dir)
    config, policy = run.config, run.policy
    inner = list(acceptance_edges)[1:-1]  # binned as the controller bins its estimate
    counts = np.zeros((config.max_batch + 1, len(inner) + 1))
    bar = tqdm(total=len(config.eval_workloads) * episodes, desc=desc, disable=not progress)
    for name in config.eval_workloads:
        env = run.env(name)
        for s in range(seed, seed + episodes):
            for obs, _, rows, _ in policy_steps(policy, env, s):
                if rows > 0 and obs[STALENESS] < 1.0:
                    counts[rows, bisect_right(inner, obs[ACCEPTANCE])] += 1
            bar.update()
    bar.close()
    return counts


def policy_steps(policy, env, seed: int):
    """One episode of ``policy`` (deterministic, SB3's ``predict``) in ``env`` from ``seed``:
    per step, ``(observation acted on, K, rows the step decoded, the step's info)``."""
    obs, _ = env.reset(seed=seed)
    done, start = False, True
    while not done:
        k, _ = policy.predict(obs, episode_start=np.array([start]))
        start = False
        rows = env.unwrapped._batch_ahead()
        after, _, terminated, truncated, info = env.step(k)
        yield obs, int(k), rows, info
        obs, done = after, terminated or truncated


@dataclass
class Fidelity:
    """How faithfully a table serves the policy it was exported from."""

    states: int
    """Steps of the policy's own episodes (steps decoding no row are not counted)."""
    matches: int
    """Of them, the steps where the table's controller chose the policy's K."""
    policy_tokens_per_s: float
    table_tokens_per_s: float
    by_workload: dict[str, dict] = field(default_factory=dict)
    mean_acceptance: float = float("nan")
    """The acceptance estimate the policy observed, averaged over its steps with a fresh
    estimate: the default operating point of the vLLM and TensorRT-LLM exports."""

    @property
    def match(self) -> float:
        return self.matches / self.states if self.states else float("nan")

    @property
    def ratio(self) -> float:
        return self.table_tokens_per_s / self.policy_tokens_per_s

    @property
    def passed(self) -> bool:
        return self.match >= MIN_MATCH and self.ratio >= MIN_RATIO

    def format(self) -> str:
        lines = [
            f"fidelity: the table picks PPO's K in {self.matches}/{self.states} visited states "
            f"({self.match:.2%}, goal >= {MIN_MATCH:.0%}); tokens/s {self.table_tokens_per_s:.1f}"
            f" against PPO's {self.policy_tokens_per_s:.1f} ({self.ratio:.4f}x, goal >= "
            f"{MIN_RATIO})"
        ]
        for name, w in self.by_workload.items():
            lines.append(
                f"  {name}: match {w['match']:.2%}, tokens/s table {w['table_tokens_per_s']:.1f}"
                f" PPO {w['policy_tokens_per_s']:.1f}"
            )
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "states": self.states,
            "matches": self.matches,
            "match": self.match,
            "policy_tokens_per_s": self.policy_tokens_per_s,
            "table_tokens_per_s": self.table_tokens_per_s,
            "ratio": self.ratio,
            "mean_acceptance": None if np.isnan(self.mean_acceptance) else self.mean_acceptance,
            "by_workload": self.by_workload,
        }


@dataclass
class PolicyRuns:
    """The policy's own episodes of a fidelity check, recorded so that a table can shadow
    them afterwards (:func:`check_fidelity`)."""

    seeds: list[int]
    steps: dict[str, list[list[tuple[int, int, int, int, float]]]]
    """Per workload, per seed, per step: ``(rows decoded, K, drafted, accepted, the
    observation's acceptance the policy chose K from)``."""
    tokens: dict[str, list]
    """Per workload: ``[committed tokens, seconds]`` over its episodes."""
    fresh: list[float]
    """The acceptance estimate at every step where it was fresh."""

    @property
    def mean_acceptance(self) -> float:
        return float(np.mean(self.fresh)) if self.fresh else float("nan")


def play_policy(
    run_dir: TrainedRun | str | Path,
    *,
    episodes: int = FIDELITY_EPISODES,
    seed: int = FIDELITY_SEED,
    progress: bool = True,
) -> PolicyRuns:
    """Play the run's policy on ``episodes`` seeds (from ``seed``) of each of its evaluation
    workloads in the surrogate, and record what a table needs to shadow it."""
    from tqdm.auto import tqdm

    from specrl.envs.base import ACCEPTANCE, STALENESS

    run = as_run(run_dir)
    config, policy = run.config, run.policy
    runs = PolicyRuns([seed + i for i in range(episodes)], {}, {}, [])
    bar = tqdm(
        total=len(config.eval_workloads) * episodes, desc="fidelity: policy", disable=not progress
    )
    for name in config.eval_workloads:
        env = run.env(name)
        runs.steps[name], runs.tokens[name] = [], [0, 0.0]
        for s in runs.seeds:
            steps = []
            for obs, k, rows, info in policy_steps(policy, env, s):
                steps.append((rows, k, info["drafted"], info["accepted"], float(obs[ACCEPTANCE])))
                if obs[STALENESS] == 0.0:  # the estimate is fresh
                    runs.fresh.append(float(obs[ACCEPTANCE]))
                runs.tokens[name][0] += info["committed"]
                runs.tokens[name][1] += info["step_time_s"]
            runs.steps[name].append(steps)
            bar.update()
    bar.close()
    return runs


def check_fidelity(
    run_dir: TrainedRun | str | Path,
    table: KTable,
    *,
    episodes: int = FIDELITY_EPISODES,
    seed: int = FIDELITY_SEED,
    progress: bool = True,
    policy_runs: PolicyRuns | None = None,
) -> Fidelity:
    """Play the run's policy on ``episodes`` seeds of each of its evaluation workloads in the
    surrogate (or take ``policy_runs``, from :func:`play_policy`), with the table's controller
    shadowing it (fed the same drafted and accepted counts), then play the table alone on the
    same seeds (:class:`LookupPolicy`). A run trained on a per-request estimate
    (``acceptance_estimate`` other than ``"steps"``) has its table's controller read the
    observation's acceptance, as :class:`LookupPolicy` serves it in that env, not a step EMA
    of its own."""
    from tqdm.auto import tqdm

    from specrl.envs.rollout import run_episode
    from specrl.policies.lookup import LookupPolicy

    run = as_run(run_dir)
    config = run.config
    if table.k_max != config.k_max:
        raise SpecrlError(
            f"the table drafts up to K={table.k_max} but {run.run_dir} was trained with "
            f"k_max={config.k_max}; check a table exported from that run"
        )
    if policy_runs is None:
        policy_runs = play_policy(run, episodes=episodes, seed=seed, progress=progress)
    if list(policy_runs.steps) != list(config.eval_workloads):
        raise SpecrlError(
            f"policy_runs hold the workloads {list(policy_runs.steps)}, but {run.run_dir} "
            f"evaluates on {list(config.eval_workloads)}; play them with "
            f"play_policy({str(run.run_dir)!r})"
        )
    total = matches = 0
    tokens = {"policy": 0, "table": 0}
    seconds = {"policy": 0.0, "table": 0.0}
    by_workload = {}
    bar = tqdm(
        total=len(config.eval_workloads) * len(policy_runs.seeds),
        desc="fidelity: table",
        disable=not progress,
    )
    observed = config.acceptance_estimate != "steps"
    for name in config.eval_workloads:
        env = run.env(name)
        mine = {"states": 0, "matches": 0, "table": [0, 0.0]}
        mine["policy"] = policy_runs.tokens[name]
        for s, steps in zip(policy_runs.seeds, policy_runs.steps[name]):
            shadow = LookupController(table, acceptance_estimate=config.acceptance_estimate)
            for rows, k, drafted, accepted, seen in steps:
                if observed:  # the figure the env computed, never stale
                    shadow.tracker.estimate, shadow.tracker.since_measured = seen, 0
                if rows > 0:
                    mine["states"] += 1
                    mine["matches"] += int(shadow.choose_k(rows) == k)
                if not observed:
                    shadow.observe(drafted, accepted, k)
            served = run_episode(
                env,
                LookupPolicy(
                    table,
                    max_batch=config.max_batch,
                    k_max=config.k_max,
                    acceptance_estimate=config.acceptance_estimate,
                ),
                seed=s,
            )
            mine["table"][0] += served.tokens
            mine["table"][1] += served.seconds
            bar.update()
        total += mine["states"]
        matches += mine["matches"]
        for who in ("policy", "table"):
            tokens[who] += mine[who][0]
            seconds[who] += mine[who][1]
        by_workload[name] = {
            "match": mine["matches"] / max(mine["states"], 1),
            "policy_tokens_per_s": mine["policy"][0] / mine["policy"][1],
            "table_tokens_per_s": mine["table"][0] / mine["table"][1],
        }
    bar.close()
    return Fidelity(
        states=total,
        matches=matches,
        policy_tokens_per_s=tokens["policy"] / seconds["policy"],
        table_tokens_per_s=tokens["table"] / seconds["table"],
        by_workload=by_workload,
        mean_acceptance=policy_runs.mean_acceptance,
    )


def checked_table(
    run_dir: TrainedRun | str | Path,
    *,
    k_max: int | None = None,
    acceptance: float | None = None,
    check: bool = True,
    episodes: int = FIDELITY_EPISODES,
    progress: bool = True,
    monotone: bool = False,
    probe_scope: str = DEFAULT_PROBE_SCOPE,
) -> tuple[KTable, Fidelity | None]:
    """:func:`table_from_run` and, with ``check``, :func:`check_fidelity`, whose result goes
    into the provenance (``fidelity``). The provenance's ``operating_acceptance`` (where the
    vLLM and TensorRT-LLM exports collapse the table, and where a probe of the scope
    "operating" looks) is ``acceptance`` if given, else the mean acceptance estimate the
    policy saw in the check's episodes (played first; without ``check`` they are still played
    for it, but not the table's), else the profile's mean acceptance."""
    run = as_run(run_dir, k_max)  # refuse before any episode is played
    if acceptance is not None:
        acceptance = check_acceptance(acceptance, "--acceptance")
    _check_probe_scope(probe_scope)
    runs = None
    if check or acceptance is None:
        runs = play_policy(run, episodes=episodes, progress=progress)
        if acceptance is None and runs.fresh:
            acceptance = round(runs.mean_acceptance, 4)
    table = table_from_run(
        run,
        k_max=k_max,
        monotone=monotone,
        progress=progress,
        probe_scope=probe_scope,
        probe_acceptance=acceptance,
    )
    if acceptance is None:
        acceptance = profile_acceptance(run.profile)
    fidelity = None
    if check:
        fidelity = check_fidelity(run, table, progress=progress, policy_runs=runs)
        table.provenance["fidelity"] = fidelity.to_json()
    table.provenance["operating_acceptance"] = acceptance
    return table, fidelity
