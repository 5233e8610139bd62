"""``LiveSpecEnv``: the real engine serving a workload, one env step per engine step."""

from __future__ import annotations

import copy
import statistics
import warnings
from pathlib import Path

import numpy as np

from specrl.envs.base import ACCEPTANCE, STALENESS, Served, SpecEnvBase
from specrl.envs.request_acceptance import (
    missing_groups,
    profile_groups,
    request_group,
    request_posterior,
)
from specrl.errors import SpecrlError, SpecrlWarning
from specrl.features import checked_estimate
from specrl.profile.fingerprint import check_compatible, other_weights, pair_fingerprint
from specrl.profile.schema import Profile, load_profile
from specrl.workload import profile_workload_kwargs, resolve_prompt
from specrl.workload.prompts import token_streams


def refuse_prompts_profile(profile: Profile, source: str, hint: str = "") -> None:
    """A :class:`SpecrlError` if ``profile`` was measured on a prompts file: live runs serve
    the held-out corpus, whose acceptance such a profile does not hold."""
    record = profile.meta.get("prompts")
    if record is not None:
        raise SpecrlError(
            f"{source} was measured on the prompts file {record.get('file')!r} (domains "
            f"{record.get('domains')}); the live env serves the held-out corpus, whose "
            "acceptance that profile does not hold. Use a profile measured without --prompts "
            f"for live runs (`specrl profile --out P.json`){hint}"
        )


REFERENCE_PROMPT_TOKENS = 16
"""Prompt length of :func:`measure_plain_decode_tokens_per_s`: the shortest context a default
profile measures (``specrl profile --contexts``)."""


def measure_plain_decode_tokens_per_s(
    pair,
    streams: dict[str, list[int]],
    *,
    device: str = "cpu",
    warmup_steps: int = 4,
    timed_steps: int = 32,
) -> float:
    """Committed tokens per second of plain decoding (K=0) at batch 1 with ``pair``'s target on
    ``device``: what :attr:`Profile.plain_decode_tokens_per_s` holds, measured here in a few
    seconds instead of read from a profile.

    One greedy request with a :data:`REFERENCE_PROMPT_TOKENS`-token prompt cut from the first
    of ``streams`` is served by a :class:`~specrl.engine.SpecEngine` without a draft (at K=0
    the draft does not run). The first ``warmup_steps`` steps, the prefill among them, are
    dropped; each timed step commits one token, so the rate is one over the median of the
    ``timed_steps`` step times the engine measured (device-synchronized).
    """
    from specrl.engine import SpecEngine

    prompt = next(iter(streams.values()))[:REFERENCE_PROMPT_TOKENS]
    steps = warmup_steps + timed_steps
    engine = SpecEngine(
        pair.target,
        None,
        max_batch=1,
        max_len=len(prompt) + steps + 1,
        k_max=0,
        device=device,
    )
    engine.add(prompt, max_new_tokens=steps + 1)
    times = [engine.step(0).total_time for _ in range(steps)][warmup_steps:]
    return 1.0 / statistics.median(times)


class LiveSpecEnv(SpecEnvBase):
    """Serve a workload with the real speculative decoding engine, choosing K every step.

    One env step is one :meth:`SpecEngine.step` over the whole running batch with the chosen
    K. The episode serves a trace: a fixed list of requests admitted by its load pattern
    (closed-loop concurrency schedules or open-loop Poisson arrivals, see
    :mod:`specrl.workload`). Each request decodes with its own ``temperature`` and ``top_p``
    (greedy at temperature 0, the engine's rejection sampler otherwise, seeded from
    ``np_random``) and ignores EOS, so every request commits exactly its ``max_new_tokens`` and
    the tokens of an episode do not depend on the policy.

    ## Action Space

    ``Discrete(k_max + 1)``: the action is K, the draft tokens per row for this step; 0 turns
    speculation off (plain decoding, the draft does not run). Rows near their token budget
    draft fewer (``min(K, tokens left - 1)``).

    ## Observation Space

    ``Box(0, 1, (8,), float32)``; every entry is scaled into [0, 1] and computed by
    :mod:`specrl.features` (which a serving-side controller shares):

    | i | name       | meaning                                            | scale                 |
    |---|------------|----------------------------------------------------|-----------------------|
    | 0 | batch      | rows the next step decodes (running + admitted)    | / max_batch           |
    | 1 | queue      | requests waiting beyond the free rows              | / max_batch, clip 1   |
    | 2 | acceptance | EMA (weight 0.25) of per-token acceptance, K>0     | rate; 0 at start      |
    | 3 | staleness  | steps since acceptance was last measured (K>0)     | / 32, clip 1; 1 first |
    | 4 | step_time  | measured seconds of the last step                  | log, see below        |
    | 5 | context    | longest row (prompt + committed), last step        | / max_len             |
    | 6 | last_k     | K of the last step                                 | / k_max; 0 at start   |
    | 7 | last_accept| accepted / drafted of the last step; 0 if it drafted nothing | rate     |

    ``step_time = clip(1 + log10(seconds) / 4, 0, 1)``: 0.1 ms -> 0, 10 ms -> 0.5, 1 s -> 1;
    0 at start. The acceptance estimate is only updated by steps that draft, so after K=0
    steps it goes stale (entry 3 says how stale) rather than being guessed.

    ## Rewards

    The objective is aggregate goodput: committed tokens of the episode divided by its serving
    time, ``sum(tokens) / sum(seconds)`` (idle gaps between open-loop arrivals are skipped and
    not counted). Each step pays::

        reward = (committed - reference_tokens_per_s * step_seconds) / max_batch

    Because the tokens of an episode are fixed by the trace, a complete episode returns
    ``(total_tokens - reference_tokens_per_s * total_seconds) / max_batch``, which decreases
    with total time: returns rank policies exactly as ``sum(tokens) / sum(seconds)`` does, for
    any ``reference_tokens_per_s > 0``. The mean of per-step tokens/s does not (a policy can win
    many cheap steps and still lose on total time; ``tests/test_env_reward.py`` has such a
    case). Per step, the reward is positive when the step beat the reference rate, which gives
    the agent immediate credit instead of only a cost; maximizing ``tokens - rho * time`` step
    by step is the usual way to maximize a ratio (Dinkelbach). Rankings hold for complete
    episodes; a truncated episode's return only covers the work it served.

    ## Starting State

    A fresh engine with the first requests of the trace queued: for a preset workload a new
    trace drawn from ``np_random`` (so a seed fixes it), for a fixed trace the trace itself,
    or ``options={"trace": Trace}`` for one reset. The acceptance estimate starts at 0 and
    fully stale.

    ## Episode End

    Terminated when every request of the trace has finished. No truncation of its own; add a
    step limit with ``gymnasium.make(..., max_episode_steps=N)`` (``TimeLimit``).

    ## Arguments

    * ``pair``: a ``specrl.models.ModelPair``; default: ``load_default_pair(preset)``.
    * ``preset`` (``"small"``), ``device`` (``"cpu"``): for the default pair.
    * ``workload``: a preset name (``specrl.workload.PRESETS``, default ``"mixed"``, a day of
      traffic whose load, domains and sampling shift with the hour), a ``Trace`` or a trace
      file; ``workload_kwargs`` go to ``preset_trace`` (``peak`` defaults
      to ``max_batch``, ``n_requests``, length distributions, domain mix).
    * ``k_max`` (4), ``max_batch`` (128), ``max_len`` (384): the engine's.
    * ``reference_tokens_per_s``: the reward's rate; default: plain decoding's (K=0) rate at
      batch 1, from ``profile`` or measured here (below).
    * ``profile``: path or ``Profile`` to read that rate from; refused when measured on other
      hardware or another pair, or when its cells are outside their tolerance here
      (``specrl.profile.freshness``, a 15-25 s timing; ``check_profile=False`` skips it),
      unless ``force_profile=True``. Default: the shipped profile where it passes the same
      checks; where it does not, the env measures the rate on this machine instead
      (:func:`measure_plain_decode_tokens_per_s`, a few seconds) and says so in one
      ``SpecrlWarning`` (``force_profile=True`` uses the shipped profile anyway). Only read
      when ``reference_tokens_per_s`` is not given.
    * ``streams``: ``{domain: token ids}`` prompts are cut from; default: the held-out corpus
      tokenized with the pair's tokenizer.
    * ``acceptance_estimate``: the observation's ``acceptance`` entry. ``"steps"`` (default):
      the EMA in the table above. ``"requests"``: the batch's acceptance pooled from each
      request's posterior over its own accepted runs, as the surrogate computes it
      (:mod:`specrl.posterior`), from the engine's per-row runs; staleness is
      then 0. ``"usable"``: the same with each row's draft positions cut where its tokens
      left end. Both read the candidates and the acceptance by position from ``profile``
      (default: the shipped one), which must be of this pair's weights (acceptance belongs
      to the pair, not the machine).

    Reproducible for a seed in everything but measured times: the trace, the tokens, the
    acceptance and (closed loop) the batch composition repeat; step times and, for open-loop
    traces, arrivals relative to the serving clock do not.

    ## Version History

    * v0: initial version.
    """

    def __init__(
        self,
        *,
        pair=None,
        preset: str = "small",
        device: str = "cpu",
        workload="mixed",
        workload_kwargs: dict | None = None,
        k_max: int = 4,
        max_batch: int = 128,
        max_len: int = 384,
        reference_tokens_per_s: float | None = None,
        profile: str | Path | Profile | None = None,
        force_profile: bool = False,
        check_profile: bool = True,
        streams: dict[str, list[int]] | None = None,
        acceptance_estimate: str = "steps",
    ):
        self.acceptance_estimate = checked_estimate(acceptance_estimate)
        if pair is None:
            from specrl.models.pair import load_default_pair

            pair = load_default_pair(preset, device=device)
        self.pair, self.device = pair, device
        self._pair_fingerprint: dict | None = None
        if k_max > 0 and pair.draft is None:
            raise SpecrlError(f"k_max={k_max} needs a draft model; this pair has none, use k_max=0")
        from specrl.engine import position_limit

        limit = position_limit(pair.target, pair.draft if k_max > 0 else None)
        if limit is not None and max_len > limit.positions:
            raise SpecrlError(f"max_len={max_len} exceeds {limit}; lower max_len")
        if reference_tokens_per_s is None:
            if profile is None and not force_profile:
                prof, why_not = self._shipped_profile(k_max, check_profile)
            else:
                prof = self._profile_for(
                    profile, force_profile, check_profile, k_max, streams=streams is not None
                )
            if prof is None:
                if streams is None:
                    streams = token_streams(pair.tokenizer)
                reference_tokens_per_s = measure_plain_decode_tokens_per_s(
                    pair, streams, device=device
                )
                warnings.warn(
                    "LiveSpecEnv: the shipped profile does not hold here, so the reward's "
                    "reference rate was measured on this machine instead: plain decoding (K=0) "
                    f"at batch 1 runs at {reference_tokens_per_s:.1f} tokens/s. Why: {why_not}",
                    category=SpecrlWarning,
                    stacklevel=2,
                )
            else:
                reference_tokens_per_s = prof.plain_decode_tokens_per_s
                # A prompts-file profile comes with its streams: presets draw its domains.
                if prof.meta.get("prompts") is not None:
                    workload_kwargs = {
                        **profile_workload_kwargs(prof.meta),
                        **(workload_kwargs or {}),
                    }
        self._requests = None
        if self.acceptance_estimate != "steps":  # before the base checks a fixed trace
            prof = self._acceptance_profile(profile, k_max, streams=streams is not None)
            self._estimate_from(prof, k_max=k_max)
        super().__init__(
            workload=workload,
            workload_kwargs=workload_kwargs,
            k_max=k_max,
            max_batch=max_batch,
            max_len=max_len,
            reference_tokens_per_s=reference_tokens_per_s,
        )
        if streams is None:
            streams = token_streams(pair.tokenizer)
        self.streams = streams
        self.engine = None

    def sibling(self) -> LiveSpecEnv:
        """Another env like this one (the same pair, workload, sizes, reference rate and
        acceptance estimate) with its own engine and per-request state, built without loading
        or checking anything again: what :func:`~specrl.envs.rollout.run_interleaved` plays one
        policy on beside another's. Its engine's caches are allocated on its first reset."""
        twin = copy.copy(self)
        twin.engine, twin.last_stats, twin._driver, twin.trace = None, None, None, None
        twin._np_random = None  # reset(seed=...) seeds each env's own generator
        if self._requests is not None:
            twin._requests = copy.deepcopy(self._requests)
        return twin

    def _fingerprint(self, k_max: int) -> dict:
        """This pair's fingerprint on this device, computed once (it hashes the weights)."""
        if self._pair_fingerprint is None:
            self._pair_fingerprint = pair_fingerprint(self.pair, k_max=k_max, device=self.device)
        return self._pair_fingerprint

    def _acceptance_profile(self, profile, k_max: int, *, streams: bool) -> Profile:
        """The profile a per-request estimate reads (``profile``, default the
        shipped one): refused unless it was measured on this pair's weights with at least
        ``k_max``, and, without ``streams``, on the held-out corpus the env serves."""
        from specrl.envs.surrogate import default_profile_path
        from specrl.profile.freshness import remeasure_command

        if isinstance(profile, Profile):
            prof, source = profile, "profile"
        else:
            path = default_profile_path() if profile is None else profile
            prof, source = load_profile(path), str(path)
        if not streams:
            refuse_prompts_profile(prof, source)
        other = other_weights(prof.fingerprint, self._fingerprint(k_max))
        if other or prof.k_max < k_max:
            why = (
                f"its {' and '.join(other)} weights differ from this pair's"
                if other
                else f"its k_max is {prof.k_max}, below {k_max}"
            )
            raise SpecrlError(
                f"{source}: acceptance_estimate={self.acceptance_estimate!r} reads each "
                f"request's acceptance levels from the profile, but {why}; measure this pair with "
                f"`{remeasure_command(self.pair)}` and pass it (profile=PROFILE.json, --profile "
                "PROFILE.json), or observe the step EMA (acceptance_estimate='steps', "
                "--acceptance-estimate steps)"
            )
        return prof

    def _estimate_from(self, prof: Profile, *, k_max: int) -> None:
        """Set up the per-request estimate from ``prof``'s acceptance."""
        self._groups = profile_groups(prof)
        self._group_index = {g: i for i, g in enumerate(self._groups)}
        self._requests = request_posterior(prof, self._groups, k_max)

    def _check_trace(self, trace) -> None:
        super()._check_trace(trace)
        if self._requests is None:
            return
        missing = missing_groups(trace, self._group_index)
        if missing:
            raise SpecrlError(
                f"trace {trace.name!r} uses (domain, temperature band) {missing} that the "
                f"profile has no acceptance for, which acceptance_estimate="
                f"{self.acceptance_estimate!r} reads; use a profile measured on those prompts, "
                "or acceptance_estimate='steps'"
            )

    def _shipped_profile(self, k_max: int, check: bool) -> tuple[Profile | None, str]:
        """The shipped profile and ``""`` where it holds for this pair on this machine (its
        fingerprint matches and, with ``check``, its freshness check passes); otherwise
        ``None`` and the reason. The fingerprint's warnings (library versions, threads) are
        only given where the profile is used."""
        from specrl.envs.surrogate import default_profile_path
        from specrl.profile.freshness import check_freshness, remeasure_command

        path = default_profile_path()
        prof, remeasure = load_profile(path), remeasure_command(self.pair)
        with warnings.catch_warnings(record=True) as held:
            warnings.simplefilter("always")
            try:
                check_compatible(
                    prof,
                    self._fingerprint(k_max),
                    source=str(path),
                    remeasure=remeasure,
                )
            except SpecrlError as refusal:
                return None, str(refusal)
        if check:
            report = check_freshness(prof, self.pair, device=self.device)
            if not report.fresh:
                return None, report.message(str(path), remeasure)
        for w in held:
            warnings.warn(w.message, stacklevel=3)
        return prof, ""

    def _profile_for(
        self, profile, force: bool, check: bool, k_max: int, *, streams: bool
    ) -> Profile:
        if isinstance(profile, Profile):
            prof, source = profile, "profile"
        else:
            if profile is None:
                from specrl.envs.surrogate import default_profile_path

                profile = default_profile_path()
            prof, source = load_profile(profile), str(profile)
        if not streams:
            refuse_prompts_profile(
                prof,
                source,
                "; or from Python pass streams=tokenize_prompts(prompts, tokenizer).streams",
            )
        from specrl.profile.freshness import profile_prompts, remeasure_command

        check_compatible(
            prof,
            self._fingerprint(k_max),
            force=force,
            source=source,
            remeasure=remeasure_command(self.pair, profile_prompts(prof)),
        )
        if check:
            from specrl.profile.freshness import enforce_freshness

            enforce_freshness(prof, self.pair, device=self.device, force=force, source=source)
        return prof

    # ------------------------------------------------------------------ the real server

    def _start(self) -> None:
        if self.engine is None or self.engine.has_work:
            from specrl.engine import SpecEngine

            self.engine = None  # free the old caches before allocating new ones
            self.engine = SpecEngine(
                self.pair.target,
                self.pair.draft if self.k_max > 0 else None,
                max_batch=self.max_batch,
                max_len=self.max_len,
                k_max=self.k_max,
                device=self.device,
                vocab_padding=self.pair.vocab_padding,
            )
        self.engine.pop_finished()
        self._trace_index: dict[int, int] = {}
        if self._requests is not None:
            requests = self.trace.requests
            self._requests.start(len(requests))
            self._trace_groups = np.array(
                [request_group(self._group_index, r) for r in requests], dtype=np.int64
            )
            self._trace_budget = np.array([r.max_new_tokens for r in requests], dtype=np.int64)
            self._last_estimate = 0.0

    def close(self) -> None:
        """Free the engine and its caches; a later ``reset`` builds a new one."""
        self.engine = None
        super().close()

    def _submit(self, requests, first: int) -> None:
        for index, r in enumerate(requests, start=first):
            seed = int(self.np_random.integers(2**62)) if r.temperature > 0 else None
            rid = self.engine.add(
                resolve_prompt(self.streams, r),
                max_new_tokens=r.max_new_tokens,
                temperature=r.temperature,
                top_p=r.top_p,
                seed=seed,
            )
            self._trace_index[rid] = index
            if self._requests is not None:
                self._requests.admit(index, int(self._trace_groups[index]))

    def _batch_ahead(self) -> int:
        return min(self.max_batch, self.engine.num_running + self.engine.num_waiting)

    def _get_obs(self) -> np.ndarray:
        obs = super()._get_obs()
        if self._requests is not None:
            index, groups = self._trace_index, self._trace_groups
            running = self.engine.running_rows()
            rows = np.array([index[rid] for rid, _ in running], dtype=np.int64)
            generated = np.array([g for _, g in running], dtype=np.int64)
            # The coming step admits the first waiting requests into its free rows; one that
            # ends on its prefill token is not decoded.
            free = self.max_batch - len(running)
            waiting = [(index[rid], new) for rid, new in self.engine.waiting_rows()[:free]]
            incoming = np.array([i for i, new in waiting if new > 1], dtype=np.int64)
            left = None
            if self.acceptance_estimate == "usable":  # tokens left after the step's commits
                left = (
                    self._trace_budget[rows] - generated,
                    np.array([new - 1 for _, new in waiting if new > 1]),
                )
            a = self._requests.estimate(rows, groups[rows], generated, groups[incoming], left)
            if a is not None:
                self._last_estimate = a
            obs[ACCEPTANCE], obs[STALENESS] = self._last_estimate, 0.0
        return obs

    def _queued(self) -> int:
        return max(0, self.engine.num_running + self.engine.num_waiting - self.max_batch)

    def _serve(self, k: int) -> Served:
        stats = self.engine.step(k)
        index = self._trace_index
        if self._requests is not None and stats.drafted:
            rows = np.array([index[r] for r in stats.row_request_ids], dtype=np.int64)
            self._requests.observe(
                rows,
                self._trace_groups[rows],
                np.array(stats.row_generated, dtype=np.int64),
                np.array(stats.row_accepted, dtype=np.int64),
                np.array(stats.row_drafted, dtype=np.int64),
            )
        finished = [index.pop(f.request_id) for f in self.engine.pop_finished()]
        self.last_stats = stats
        return Served(
            stats.committed,
            stats.total_time,
            stats.drafted,
            stats.accepted,
            finished,
            stats.admitted,
            stats.prefill_time,
            stats.batch_size,
            float(stats.max_context),
            stats.catchup_tokens > 0,
        )
