"""Controllers by command-line name: ``off``, ``fixed:K``, ``threshold:K:B``,
``threshold:tuned``, ``sweep``, ``schedule:FILE``, ``hf``, ``ema``, ``goodput``, ``oracle``,
``ppo:RUN_DIR`` and ``lookup:TABLE.json``."""

from __future__ import annotations

from pathlib import Path

from specrl.errors import SpecrlError
from specrl.policies.adaptive import AcceptEMA, HFHeuristic
from specrl.policies.base import KPolicy
from specrl.policies.engineer import tune_sweep, tune_threshold
from specrl.policies.fixed import BatchThreshold, FixedK
from specrl.policies.goodput import Goodput
from specrl.policies.oracle import Oracle
from specrl.policies.schedule import BatchSchedule
from specrl.policy_names import VALID_FORMS, split_spec
from specrl.profile import Profile


def default_policies(k_max: int, *, surrogate: bool = True) -> list[str]:
    """The baselines a comparison runs: off, every fixed K, the batch threshold, the engineer's
    tuned threshold and per-bucket sweep, the adaptive ones and, on the surrogate only, the
    oracle."""
    names = ["off", *(f"fixed:{k}" for k in range(1, k_max + 1))]
    if k_max >= 1:
        names += [f"threshold:{k_max}:8", "threshold:tuned", "sweep", "hf", "ema", "goodput"]
    return names + (["oracle"] if surrogate else [])


def make_policy(
    spec: str, *, env, profile: Profile | str | Path | None = None, force: bool = False
) -> KPolicy:
    """The controller ``spec`` names, sized for ``env`` (its ``k_max``, ``max_batch`` and
    ``max_len``).

    :param spec: one of :data:`VALID_FORMS`.
    :param env: the environment the policy will act in (wrapped or not).
    :param profile: the hardware profile for ``goodput`` when ``env`` has none (the live
        env); the env's own profile takes precedence. ``lookup`` refuses a table made for
        another device or pair than this profile's.
    :param force: ``lookup``: use a table made for other hardware anyway, with a warning.
    """
    kind, args = split_spec(spec)
    base = getattr(env, "unwrapped", env)
    try:
        k_max, max_batch, max_len = base.k_max, base.max_batch, base.max_len
    except AttributeError:
        raise SpecrlError(
            f"policy {spec!r}: {type(env).__name__} is not a specrl env (no k_max, max_batch, "
            "max_len)"
        ) from None
    if kind == "off":
        return FixedK(0)
    if kind == "fixed":
        return FixedK(_bounded(spec, "K", args[0], 0, k_max))
    if kind == "threshold" and args == ["tuned"]:
        return tune_threshold(env, profile=profile)
    if kind == "sweep":
        return tune_sweep(env, profile=profile)
    if kind == "threshold":
        k = _bounded(spec, "K", args[0], 0, k_max)
        return BatchThreshold(k, _bounded(spec, "B", args[1], 0, None), max_batch)
    if kind == "schedule":
        return BatchSchedule.from_file(args[0], max_batch=max_batch, max_len=max_len, k_max=k_max)
    if kind == "ppo":
        from specrl.policies.ppo import PPOPolicy

        return PPOPolicy.load(
            args[0],
            max_batch=max_batch,
            k_max=k_max,
            acceptance_estimate=getattr(base, "acceptance_estimate", "steps"),
        )
    if kind == "lookup":
        from specrl.policies.lookup import LookupPolicy

        own = getattr(base, "profile", None)
        return LookupPolicy(
            args[0],
            max_batch=max_batch,
            k_max=k_max,
            max_len=max_len,
            profile=own if own is not None else profile,
            force=force,
            acceptance_estimate=getattr(base, "acceptance_estimate", "steps"),
        )
    if kind == "hf":
        return HFHeuristic(k_max=k_max)
    if kind == "ema":
        return AcceptEMA(k_max=k_max, max_batch=max_batch)
    if kind == "goodput":
        own = getattr(base, "profile", None)
        if own is None and profile is None:
            raise SpecrlError(
                f"policy {spec!r} predicts step times from a hardware profile and this env "
                "keeps none; pass profile= (the one the live env was built with: by default "
                "specrl.envs.default_profile_path())"
            )
        return Goodput(
            own if own is not None else profile,
            max_batch=max_batch,
            max_len=max_len,
            k_max=k_max,
        )
    return Oracle(env)


def trained_estimate(specs: list[str], default: str = "steps") -> str:
    """The acceptance estimate the ``lookup:`` tables and ``ppo:`` runs among ``specs`` were
    trained on (a table's provenance ``acceptance_estimate``, a run's config), so that a
    comparison builds its env with the observation they read; ``default`` where ``specs``
    names none. Policies trained on different estimates cannot share one env's observation:
    a SpecrlError names them."""
    found: dict[str, str] = {}
    for spec in specs:
        kind, args = split_spec(spec)
        if kind == "lookup":
            from specrl.table import load_table

            found[spec] = load_table(args[0]).provenance.get("acceptance_estimate", "steps")
        elif kind == "ppo":
            from specrl.config import load_config

            found[spec] = load_config(args[0]).acceptance_estimate
    estimates = set(found.values())
    if len(estimates) > 1:
        named = ", ".join(f"{spec} ({estimate})" for spec, estimate in found.items())
        raise SpecrlError(
            f"the policies were trained on different acceptance estimates: {named}; an env's "
            "observation holds one: compare each estimate's policies in a run of its own"
        )
    return estimates.pop() if estimates else default


def observation_estimate(specs: list[str], given: str | None) -> str:
    """The acceptance estimate a comparison of ``specs`` observes: ``given`` (a command's
    ``--acceptance-estimate``) or, when None, the one its trained policies read
    (:func:`trained_estimate`). Refused before any env is built where ``given`` differs from
    theirs."""
    trained = trained_estimate(specs, default=given or "steps")
    if given is not None and trained != given:
        raise SpecrlError(
            f"--acceptance-estimate {given}: the lookup: tables and ppo: runs compared were "
            f"trained on {trained!r}, and read only that figure; drop the option (the default "
            "is theirs), or compare policies trained on it"
        )
    return trained


def make_policies(
    specs: list[str], *, env, profile: Profile | str | Path | None = None, force: bool = False
) -> list[KPolicy]:
    """:func:`make_policy` for each of ``specs``. Policies whose display names collide (two
    runs are both ``ppo``, two tables both ``lookup:table.json``) are named by their specs
    instead (``ppo:runs/a``, ``ppo:runs/b``), so a comparison can hold both."""
    policies = [make_policy(spec, env=env, profile=profile, force=force) for spec in specs]
    names = [p.name for p in policies]
    for policy, spec in zip(policies, specs):
        if names.count(policy.name) > 1:
            policy.name = spec.strip()
    return policies


def _bounded(spec: str, what: str, text: str, low: int, high: int | None) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"{low}..{high} (k_max {high})"
        raise SpecrlError(
            f"policy {spec!r}: {what} must be an integer {bound}, got {text!r}; valid: "
            f"{VALID_FORMS}"
        )
    return value
