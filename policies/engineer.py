"""The engineer who tunes by hand: the two schedules a serving engineer writes after
benchmarking each concurrency, tuned in the surrogate on seeds apart from any evaluation.

* :func:`tune_threshold` (``threshold:tuned``): the best "K up to B rows, off above" over
  K in 1..k_max and B over :data:`THRESHOLD_BATCHES` (and ``max_batch``: always on).
* :func:`tune_sweep` (``sweep``): one run of each static K (off, 1..k_max); in each batch
  bucket (:data:`specrl.features.BATCH_BUCKETS`), the K with the most tokens/s in the steps
  of that bucket. This is what a benchmark at each concurrency gives, written as a
  vLLM-style schedule. A bucket no static run reached takes the K of the nearest bucket
  below that was reached (above, for the smallest buckets).

Both score candidates by aggregate tokens/s (sum of tokens over sum of seconds) over
:data:`TUNE_EPISODES` episodes from :data:`specrl.seeds.TUNE_SEED` of the env's own workload
and profile (:class:`Scorer`; over several workloads, the geometric mean of theirs; the
export's searches score against each workload's own engineer instead,
:class:`specrl.train.search.VersusEngineer`). A :class:`Tuning` records the seeds, the
episodes played and their cost.
"""

from __future__ import annotations

import hashlib
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from specrl.envs import SurrogateSpecEnv
from specrl.errors import SpecrlError
from specrl.features import batch_bucket, bucket_bounds
from specrl.policies.episode_pool import play_policies, play_schedules
from specrl.policies.fixed import BatchThreshold
from specrl.policies.schedule import BatchSchedule
from specrl.results import summarize
from specrl.seeds import TUNE_SEED

TUNE_EPISODES = 2
"""Tuning episodes per candidate and workload."""
THRESHOLD_BATCHES = (2, 4, 8, 12, 16, 24, 32, 64)
"""The thresholds B an engineer tries: the concurrencies a benchmark usually runs at."""


@dataclass
class Tuning:
    """How a tuned schedule was chosen."""

    method: str
    """``"threshold"``, ``"sweep"`` or ``"sweep:trtllm"`` (``experiments/headroom.py``:
    ``"oracle + engineer"``)."""
    chosen: str
    """The schedule in words, e.g. ``"K=2 up to B=16, off above"``."""
    workloads: list[str]
    seeds: list[int]
    episodes: int = 0
    """Episodes played while tuning."""
    surrogate_s: float = 0.0
    """Serving seconds those episodes simulate: what the benchmark would take on the machine."""
    wall_s: float = 0.0
    tokens_per_s: float = 0.0
    """The chosen schedule's tokens/s on the tuning episodes."""
    scores: dict[str, float] = field(default_factory=dict)
    """Every candidate's tokens/s on the tuning episodes."""

    @classmethod
    def played(
        cls,
        method: str,
        chosen: str,
        scorer: Scorer,
        start: float,
        tokens_per_s: float,
        scores: dict[str, float],
    ) -> Tuning:
        """How a schedule was chosen on ``scorer``'s one tuning env and seeds, with what
        ``scorer`` has played so far and the wall time since ``start``
        (:func:`time.perf_counter`)."""
        return cls(
            method=method,
            chosen=chosen,
            workloads=[workload_name(env) for env in scorer.envs],
            seeds=scorer.seeds,
            episodes=scorer.episodes,
            surrogate_s=scorer.surrogate_s,
            wall_s=time.perf_counter() - start,
            tokens_per_s=tokens_per_s,
            scores=scores,
        )

    def describe(self) -> str:
        seeds = f"{self.seeds[0]}" if len(self.seeds) == 1 else f"{self.seeds[0]}-{self.seeds[-1]}"
        return (
            f"{self.chosen}; tuned on seeds {seeds} of {', '.join(self.workloads)}: "
            f"{self.episodes} episodes, {self.surrogate_s:,.0f} surrogate s "
            f"({self.wall_s:.1f} s wall)"
        )

    def to_json(self) -> dict:
        return {
            "method": self.method,
            "chosen": self.chosen,
            "workloads": self.workloads,
            "seeds": self.seeds,
            "episodes": self.episodes,
            "surrogate_s": self.surrogate_s,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
            "scores": self.scores,
        }


def tuning_seeds(episodes: int = TUNE_EPISODES, seed: int = TUNE_SEED) -> list[int]:
    return list(range(seed, seed + episodes))


def tuning_env(env, profile=None):
    """A surrogate env on ``env``'s profile, workload and sizes: ``env`` itself when it is
    the surrogate; for the live env, one on its profile (or ``profile``)."""

    base = getattr(env, "unwrapped", env)
    if isinstance(base, SurrogateSpecEnv):
        return base
    own = getattr(base, "profile", None)
    profile = own if own is not None else profile
    if profile is None:
        raise SpecrlError(
            "the engineer's baselines are tuned in the surrogate on a hardware profile, and "
            "this env keeps none; pass profile= (the one the live env was built with)"
        )
    return SurrogateSpecEnv(
        profile=profile,
        workload=base.workload,
        workload_kwargs=dict(base._workload_kwargs),
        k_max=base.k_max,
        max_batch=base.max_batch,
        max_len=base.max_len,
    )


def workload_name(env) -> str:
    workload = getattr(env, "unwrapped", env).workload
    return str(getattr(workload, "name", workload))


_shared: dict | None = None
"""The episodes every :class:`Scorer` shares inside :func:`shared_episodes`, else None."""


@contextmanager
def shared_episodes():
    """Inside this block every :class:`Scorer` shares the episodes it plays: a schedule played
    on a seed of an env alike in profile (by content), workload preset, sizes and workload
    settings is played once. ``specrl demo`` tunes the engineer on the training mix for the
    export and again per workload for the comparison, on the same tuning seeds; this makes
    the second tuning a lookup. Each Scorer still counts the episodes and surrogate seconds
    its tuning needs, so reported tuning costs do not change. Nested blocks share the outer
    one's episodes; they are dropped when the outermost block ends."""
    global _shared
    outer = _shared
    if outer is None:
        _shared = {"episodes": {}, "profiles": {}}
    try:
        yield
    finally:
        _shared = outer


def _served(dense) -> np.ndarray:
    """``dense`` as an episode serves it: its entry for 0 rows (no step) set to 0, so that K
    at every batch size and the threshold "K up to ``max_batch``" are one schedule."""
    dense = np.array(dense, dtype=np.int64)
    dense[0] = 0
    return dense


def _env_key(env) -> tuple | None:
    """What an episode of a fixed seed and schedule depends on in ``env``: its profile's
    content, workload preset, workload settings and sizes; None (not shared) for anything but
    a surrogate env serving a preset."""
    base = getattr(env, "unwrapped", env)
    # A preset is held as its name (drawn afresh per seed); a fixed trace as a Trace.
    if not isinstance(base, SurrogateSpecEnv) or not isinstance(base.workload, str):
        return None
    name = base.workload
    profiles = _shared["profiles"]
    if id(base.profile) not in profiles:  # the profile is kept, so its id is not reused
        text = json.dumps(base.profile.to_json(), sort_keys=True, default=str)
        profiles[id(base.profile)] = (base.profile, hashlib.sha256(text.encode()).hexdigest())
    settings = json.dumps(base._workload_kwargs, sort_keys=True, default=str)
    return profiles[id(base.profile)][1], name, settings, base.k_max, base.max_batch, base.max_len


class Scorer:
    """Plays schedules on fixed seeds of one or more surrogate envs and keeps the count of
    what that cost; each dense schedule is played once (results are cached, and shared
    between scorers inside :func:`shared_episodes`)."""

    def __init__(self, envs: list, seeds: list[int]):
        if not envs or not seeds:
            raise SpecrlError("Scorer: needs at least one env and one seed")
        self.envs, self.seeds = envs, list(seeds)
        self.episodes, self.surrogate_s = 0, 0.0
        self._cache: dict[bytes, list] = {}

    def play(self, dense: np.ndarray) -> list:
        """Per env, the :class:`~specrl.envs.EpisodeResult` of each seed under the schedule
        ``dense`` (K per batch size ``0..max_batch``)."""
        dense = _served(dense)
        self.prefetch([dense])
        return self._cache[dense.tobytes()]

    def prefetch(self, denses) -> None:
        """Play each schedule of ``denses`` not played yet, all in one go: on every core
        inside :func:`~specrl.policies.episode_pool.parallel_episodes`. Callers that will
        score several candidates pass them here first."""
        todo: dict[bytes, np.ndarray] = {}
        for dense in denses:
            dense = _served(dense)
            todo.setdefault(dense.tobytes(), dense)
        self._play(todo, play_schedules)

    def play_table(self, table) -> list:
        """Per env, the episode of each seed under the native ``table``
        (:class:`~specrl.table.KTable`), served by its controller; cached by the table's
        content, like a schedule."""
        self.prefetch_tables([table])
        return self._cache[table_key(table)]

    def prefetch_tables(self, tables) -> None:
        """:meth:`prefetch` for native tables."""
        from specrl.policies.lookup import LookupPolicy

        todo: dict[bytes, LookupPolicy] = {}
        for table in tables:
            key = table_key(table)
            if key not in todo and key not in self._cache:
                todo[key] = LookupPolicy(
                    table,
                    max_batch=table.max_batch,
                    k_max=table.k_max,
                    acceptance_estimate=self.envs[0].unwrapped.acceptance_estimate,
                )
        self._play(todo, play_policies)

    def score_table(self, table) -> float:
        """:meth:`score` for a native table."""
        return geometric_rate(self.play_table(table))

    def _play(self, todo: dict, play) -> None:
        """Play ``todo`` (``{key: what play() serves}``) on every env and seed, except what is
        cached here or shared, and count what it cost."""
        todo = {key: item for key, item in todo.items() if key not in self._cache}
        if not todo:
            return
        # Each episode's identity: among the shared ones where its env's are shared
        # (_env_key), else its place in this scorer.
        env_keys = [None if _shared is None else _env_key(env) for env in self.envs]
        slots = [
            (key, i, j, (key, i, j) if env_key is None else (env_key, seed, key))
            for key in todo
            for i, env_key in enumerate(env_keys)
            for j, seed in enumerate(self.seeds)
        ]
        known = _shared["episodes"] if _shared is not None else {}
        tasks = {
            episode: (self.envs[i], todo[key], self.seeds[j])
            for key, i, j, episode in slots
            if episode not in known
        }
        played = dict(zip(tasks, play(list(tasks.values())), strict=True))
        for key, i, j, episode in slots:
            result = played[episode] if episode in played else known[episode]
            if env_keys[i] is not None:
                known[episode] = result
            per_env = self._cache.setdefault(key, [[None] * len(self.seeds) for _ in self.envs])
            per_env[i][j] = result
        for key in todo:
            runs = [r for per_env in self._cache[key] for r in per_env]
            self.episodes += len(runs)
            self.surrogate_s += sum(r.seconds for r in runs)

    def play_policy(self, policy_for) -> list:
        """Per env, the episode of each seed under ``policy_for(env)`` (not cached)."""
        from specrl.envs.rollout import run_episode

        out = []
        for env in self.envs:
            policy = policy_for(env)
            runs = [run_episode(env, policy, seed=s) for s in self.seeds]
            self.episodes += len(runs)
            self.surrogate_s += sum(r.seconds for r in runs)
            out.append(runs)
        return out

    objective = "geometric mean over the workloads of aggregate tokens/s"
    """What :meth:`score` is, in words (a search's result records it)."""

    def score(self, dense: np.ndarray) -> float:
        """The geometric mean over envs of aggregate tokens/s: every workload counts alike."""
        return geometric_rate(self.play(dense))

    def engineer_ratios(self, dense: np.ndarray) -> dict[str, float]:
        """Per workload, tokens/s over its engineer: none here (a plain score; the search's
        ``VersusEngineer`` has them)."""
        return {}

    def engineer_methods(self) -> dict[str, str]:
        """Per workload, its engineer's method: none here (see :meth:`engineer_ratios`)."""
        return {}

    def rates(self, dense: np.ndarray) -> list[float]:
        """Per env, aggregate tokens/s over its seeds under ``dense``."""
        return [_rate(runs) for runs in self.play(dense)]

    def table_rates(self, table) -> list[float]:
        """:meth:`rates` for a native table, served by its controller."""
        return [_rate(runs) for runs in self.play_table(table)]

    def view(self, i: int) -> EnvScorer:
        """The scorer of env ``i`` alone, sharing this one's episodes (nothing is replayed)."""
        return EnvScorer(self, i)


class EnvScorer:
    """One env of a :class:`Scorer`: its schedules are played (and cached) by the parent on
    every env, and scored on env ``i`` alone, so tuning the engineer per workload on a mix
    costs no episode the mix's tuning has not played."""

    def __init__(self, parent: Scorer, i: int):
        self.parent, self.i = parent, i
        self.envs, self.seeds = [parent.envs[i]], parent.seeds

    def prefetch(self, denses) -> None:
        self.parent.prefetch(denses)

    def play(self, dense: np.ndarray) -> list:
        return [self.parent.play(dense)[self.i]]

    def score(self, dense: np.ndarray) -> float:
        return geometric_rate(self.play(dense))


def table_key(table) -> bytes:
    """A native table's identity in a :class:`Scorer`'s cache: the digest of its K cells,
    buckets, bins and probe rule (not its provenance, which no episode reads)."""
    obj = table.to_json()
    obj.pop("provenance", None)
    text = json.dumps(obj, sort_keys=True)
    return b"table:" + hashlib.sha256(text.encode()).digest()


def geometric_rate(played: list) -> float:
    """The geometric mean over envs of each env's aggregate tokens/s over its episodes
    (``played``: per env, a list of :class:`~specrl.envs.EpisodeResult`)."""
    return float(np.exp(np.mean(np.log([_rate(runs) for runs in played]))))


def _rate(runs: list) -> float:
    """Aggregate tokens/s over episodes: their tokens over their seconds."""
    return sum(r.tokens for r in runs) / sum(r.seconds for r in runs)


def threshold_dense(k: int, batch: int, max_batch: int) -> np.ndarray:
    dense = np.where(np.arange(max_batch + 1) <= batch, k, 0)
    dense[0] = 0
    return dense


def threshold_candidates(k_max: int, max_batch: int) -> list[tuple[int, int]]:
    """``(K, B)`` pairs: K in 1..k_max, B in :data:`THRESHOLD_BATCHES` up to ``max_batch``,
    and ``max_batch`` itself (always on); with ``k_max`` 0 only off."""
    batches = sorted({b for b in THRESHOLD_BATCHES if b < max_batch} | {max_batch})
    pairs = [(k, b) for k in range(1, k_max + 1) for b in batches]
    return pairs or [(0, max_batch)]


def best_threshold(scorer: Scorer, k_max: int, max_batch: int) -> tuple[int, int, dict]:
    """The ``(K, B)`` of :func:`threshold_candidates` with the best ``scorer`` score (ties:
    the smaller K, then B), and every candidate's score."""
    candidates = threshold_candidates(k_max, max_batch)
    scorer.prefetch([threshold_dense(k, b, max_batch) for k, b in candidates])
    scores = {(k, b): scorer.score(threshold_dense(k, b, max_batch)) for k, b in candidates}
    k, b = max(scores, key=lambda kb: (scores[kb], -kb[0], -kb[1]))
    return k, b, scores


def tune_threshold(env, *, profile=None, seeds: list[int] | None = None) -> BatchThreshold:
    """``threshold:tuned``: the best :class:`BatchThreshold` on the tuning seeds of ``env``'s
    workload (see the module); its :class:`Tuning` is on ``.tuning``."""
    start = time.perf_counter()
    surrogate = tuning_env(env, profile)
    scorer = Scorer([surrogate], seeds or tuning_seeds())
    max_batch = surrogate.max_batch
    k, b, scores = best_threshold(scorer, surrogate.k_max, max_batch)
    policy = BatchThreshold(k, b, max_batch)
    policy.name = "threshold:tuned"
    policy.tuning = Tuning.played(
        "threshold",
        f"K={k} up to B={b}, off above" if b < max_batch else f"K={k} at every batch",
        scorer,
        start,
        tokens_per_s=scores[k, b],
        scores={f"K={kk} B<={bb}": v for (kk, bb), v in scores.items()},
    )
    return policy


def sweep_dense(bucket_k: dict[tuple[int, int], int], max_batch: int) -> np.ndarray:
    """K per batch size ``0..max_batch`` from K per (lo, hi) bucket."""
    dense = np.zeros(max_batch + 1, dtype=np.int64)
    for (lo, hi), k in bucket_k.items():
        dense[lo : min(hi, max_batch) + 1] = k
    return dense


def sweep_buckets(max_batch: int) -> list[tuple[int, int]]:
    """The batch buckets up to ``max_batch`` (the last cut at it)."""
    out, batch = [], 1
    while batch <= max_batch:
        lo, hi = bucket_bounds(batch_bucket(batch))
        out.append((lo, min(hi, max_batch)))
        batch = hi + 1
    return out


def fill_unreached(best: dict[tuple[int, int], int | None]) -> dict[tuple[int, int], int]:
    """``best`` with each None (a bucket no run reached) taken from the nearest reached bucket
    below it, or above it when none below was reached; all None: off everywhere."""
    buckets = list(best)
    reached = [i for i, b in enumerate(buckets) if best[b] is not None]
    if not reached:
        return dict.fromkeys(buckets, 0)
    out = {}
    for i, b in enumerate(buckets):
        below = [j for j in reached if j <= i]
        out[b] = best[buckets[below[-1] if below else reached[0]]]
    return out


def best_sweep(scorer: Scorer, k_max: int, max_batch: int):
    """Per bucket of :func:`sweep_buckets`, the static K with the most tokens/s in that
    bucket's steps, pooled over ``scorer``'s envs and seeds (ties: the smaller K); a bucket
    no run reached takes its neighbour's (:func:`fill_unreached`). Returns ``(K per bucket,
    the unreached buckets)``."""

    buckets = sweep_buckets(max_batch)
    rates: dict[tuple[int, int], dict[int, float]] = {b: {} for b in buckets}
    scorer.prefetch([np.full(max_batch + 1, k) for k in range(k_max + 1)])
    for k in range(k_max + 1):
        pooled = [run for runs in scorer.play(np.full(max_batch + 1, k)) for run in runs]
        by_label = summarize(f"K={k}", pooled, k_max).bucket_tokens_per_s
        for b in buckets:
            if batch_bucket(b[0]) in by_label:
                rates[b][k] = by_label[batch_bucket(b[0])]
    best = {b: (max(r, key=lambda k: (r[k], -k)) if r else None) for b, r in rates.items()}
    return fill_unreached(best), [b for b, k in best.items() if k is None]


def tune_sweep(env, *, profile=None, seeds: list[int] | None = None) -> BatchSchedule:
    """``sweep``: per batch bucket, the static K with the most tokens/s there on the tuning
    seeds of ``env``'s workload (see the module); its :class:`Tuning` is on ``.tuning``."""
    start = time.perf_counter()
    surrogate = tuning_env(env, profile)
    scorer = Scorer([surrogate], seeds or tuning_seeds())
    k_max, max_batch = surrogate.k_max, surrogate.max_batch
    bucket_k, unreached = best_sweep(scorer, k_max, max_batch)
    dense = sweep_dense(bucket_k, max_batch)
    entries = vllm_entries(dense)
    policy = BatchSchedule.from_vllm(entries, max_batch=max_batch, k_max=k_max, name="sweep")
    policy.entries = entries
    chosen = "per bucket " + ", ".join(
        f"{lo}-{hi}: {k}" if lo != hi else f"{lo}: {k}" for (lo, hi), k in bucket_k.items()
    )
    if unreached:
        where = ", ".join(f"{lo}-{hi}" for lo, hi in unreached)
        chosen += f" (unreached, from neighbours: {where})"
    own = scorer.score(dense)  # played before the cost is counted
    policy.tuning = Tuning.played(
        "sweep",
        chosen,
        scorer,
        start,
        tokens_per_s=own,
        scores={f"K={k}": scorer.score(np.full(max_batch + 1, k)) for k in range(k_max + 1)},
    )
    return policy


def trtllm_nudges(dense) -> dict[str, np.ndarray]:
    """``dense`` as TensorRT-LLM can hold it, whose smallest key's value must be the largest
    K and at least 1: itself where it already is; else clamped to its batch-1 K (when that is
    at least 1), and with its batch-1 K raised to its largest."""
    dense = np.asarray(dense)
    top = int(dense[1:].max())
    if dense[1] >= 1 and top == dense[1]:
        return {"": dense}
    out = {}
    if dense[1] >= 1:
        out["clamped to batch 1"] = np.minimum(dense, dense[1])
    raised = dense.copy()
    raised[1] = max(top, 1)
    out["batch 1 raised"] = raised
    return out


def best_trtllm_nudge(scorer: Scorer, dense) -> tuple[str, np.ndarray, dict[str, float]]:
    """``dense`` as TensorRT-LLM serves it best: of its :func:`trtllm_nudges`, the one with
    the most tokens/s on ``scorer``'s seeds (ties: the first). Returns ``(how it was
    nudged, the schedule, each nudge's tokens/s)``."""
    nudges = trtllm_nudges(dense)
    scorer.prefetch(nudges.values())
    scores = {name: scorer.score(d) for name, d in nudges.items()}
    best = max(scores, key=lambda n: scores[n])
    return best, nudges[best], scores


def tune_sweep_trtllm(env, *, profile=None, seeds: list[int] | None = None) -> BatchSchedule:
    """The sweep held to what TensorRT-LLM's ``draft_len_schedule`` can express (its
    :func:`trtllm_nudges`, the better on the tuning seeds), named ``sweep:trtllm``."""
    start = time.perf_counter()
    surrogate = tuning_env(env, profile)
    scorer = Scorer([surrogate], seeds or tuning_seeds())
    k_max, max_batch = surrogate.k_max, surrogate.max_batch
    bucket_k, _ = best_sweep(scorer, k_max, max_batch)
    best, dense, scores = best_trtllm_nudge(scorer, sweep_dense(bucket_k, max_batch))
    policy = BatchSchedule(dense, max_batch=max_batch, k_max=k_max, name="sweep:trtllm")
    policy.tuning = Tuning.played(
        "sweep:trtllm",
        "per batch " + str(vllm_entries(dense)) + (f" (the sweep {best})" if best else ""),
        scorer,
        start,
        tokens_per_s=scores[best],
        scores={name or "as swept": v for name, v in scores.items()},
    )
    return policy


def vllm_entries(dense) -> list[list[int]]:
    """``[[lo, hi, K], ...]`` for K per batch size ``0..max_batch`` (index 0 unused), equal
    neighbours merged: vLLM's ``num_speculative_tokens_per_batch_size``."""
    entries: list[list[int]] = []
    for batch, k in enumerate(np.asarray(dense)[1:].tolist(), start=1):
        if entries and entries[-1][2] == k:
            entries[-1][1] = batch
        else:
            entries.append([batch, batch, int(k)])
    return entries
