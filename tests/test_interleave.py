"""Policies played side by side (``run_interleaved``, ``compare_policies(interleave=True)``):
each episode is the one it would be alone, and the episode that has served least steps next."""

from __future__ import annotations

import pytest
from test_request_acceptance import _micro_profile

from specrl.compare import compare_policies
from specrl.envs import LiveSpecEnv, SurrogateSpecEnv, run_episode, run_interleaved
from specrl.errors import SpecrlError
from specrl.policies import make_policy
from specrl.profile.synthetic import linear_profile
from specrl.workload import LengthDist

SPECS = ["off", "fixed:3", "threshold:3:4", "ema", "goodput"]
LIVE_TRACE = {
    "n_requests": 10,
    "prompt_lengths": LengthDist(median=12, sigma=0.3, lo=4, hi=20),
    "output_lengths": LengthDist(median=10, sigma=0.4, lo=2, hi=16),
}


def _surrogate() -> SurrogateSpecEnv:
    return SurrogateSpecEnv(
        profile=linear_profile(k_max=3),
        workload="ramp",
        workload_kwargs={"peak": 12, "n_requests": 40},
        k_max=3,
        max_batch=12,
        acceptance_estimate="usable",
    )


def _same(a, b) -> None:
    """Two episodes alike in everything they record."""
    assert vars(a) == vars(b)


class _Watched:
    """A policy that checks, at each of its steps, that its episode has served no more time
    than any other unfinished one (envs finish once they committed all of their trace)."""

    def __init__(self, policy, env, envs: list, log: list):
        self.policy, self.env, self.envs, self.log = policy, env, envs, log
        self.name = policy.name

    def predict(self, obs, **kwargs):
        playing = [e.episode_seconds for e in self.envs if e.episode_tokens < e.trace.total_tokens]
        assert self.env.episode_seconds == min(playing)
        self.log.append(self.name)
        return self.policy.predict(obs, **kwargs)


def test_surrogate_episodes_side_by_side_are_the_episodes_played_alone():
    envs = [_surrogate() for _ in SPECS]
    log: list[str] = []
    policies = [_Watched(make_policy(s, env=env), env, envs, log) for s, env in zip(SPECS, envs)]
    together = run_interleaved(envs, policies, seed=4)
    alone = [run_episode(_surrogate(), make_policy(s, env=_surrogate()), seed=4) for s in SPECS]
    for a, b in zip(together, alone, strict=True):
        _same(a, b)
    assert len(log) == sum(r.steps for r in together)
    # The policies took turns: none played all of its steps before another began.
    first_ends = {name: max(i for i, n in enumerate(log) if n == name) for name in set(log)}
    first_starts = {name: log.index(name) for name in set(log)}
    assert max(first_starts.values()) < min(first_ends.values())


def test_interleaving_refuses_shared_or_missing_envs():
    env = _surrogate()
    with pytest.raises(SpecrlError, match="an env of its own"):
        run_interleaved([env, env], [make_policy("off", env=env)] * 2, seed=0)
    with pytest.raises(SpecrlError, match="2 envs for 1 policies"):
        run_interleaved([env, _surrogate()], [make_policy("off", env=env)], seed=0)
    with pytest.raises(SpecrlError, match="live env's siblings"):
        compare_policies(env, [make_policy("off", env=env)], episodes=1, interleave=True)


def _live(micro_pair) -> LiveSpecEnv:
    return LiveSpecEnv(
        pair=micro_pair,
        workload="steady-4",
        workload_kwargs=LIVE_TRACE,
        max_batch=4,
        max_len=64,
        k_max=3,
        reference_tokens_per_s=100.0,
        profile=_micro_profile(micro_pair),
        acceptance_estimate="usable",
    )


def _untimed(result) -> dict:
    """What a live episode repeats for a seed: all but the measured times."""
    timed = {"seconds", "episode_return", "mean_step_tokens_per_s", "step_seconds"}
    timed |= {"request_tpot_s", "prefill_seconds"}
    return {k: v for k, v in vars(result).items() if k not in timed}


def test_live_siblings_serve_each_episode_as_alone(micro_pair):
    env = _live(micro_pair)
    twin = env.sibling()
    assert twin.pair is env.pair and twin.streams is env.streams
    assert twin.reference_tokens_per_s == env.reference_tokens_per_s
    assert twin._requests is not env._requests  # each estimate sees its own requests
    specs = ["fixed:3", "threshold:2:2"]
    together = run_interleaved([env, twin], [make_policy(s, env=env) for s in specs], seed=6)
    assert env.engine is not twin.engine
    for spec, played in zip(specs, together, strict=True):
        alone = run_episode(_live(micro_pair), make_policy(spec, env=env), seed=6)
        assert _untimed(played) == _untimed(alone)
        assert played.tokens == env.trace.total_tokens


def test_live_comparison_side_by_side(micro_pair):
    env = _live(micro_pair)
    policies = [make_policy(s, env=env) for s in ("off", "fixed:2", "threshold:3:2")]
    report = compare_policies(env, policies, seed=3, episodes=2, interleave=True, progress=False)
    alone = [run_episode(_live(micro_pair), p, seed=s) for s in (3, 4) for p in policies]
    for i, result in enumerate(report.results):
        assert [_untimed(e) for e in result.episodes] == [
            _untimed(alone[i]),
            _untimed(alone[3 + i]),
        ]
    assert report.interleaved and report.to_json()["interleaved"] is True


def test_interleave_in_the_surrogate_is_refused_before_the_env(capsys, monkeypatch):
    import specrl.cli.compare
    from specrl.cli import main

    def no_env(args):
        raise AssertionError("the env was built")

    monkeypatch.setattr(specrl.cli.compare, "make_env", no_env)
    assert main(["compare", "--interleave", "--policies", "off"]) == 2
    assert capsys.readouterr().err == (
        "specrl: error: --interleave plays live episodes side by side; the surrogate's times "
        "do not drift: drop it, or use --env live\n"
    )
