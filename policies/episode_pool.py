"""Surrogate episodes played on every core.

The engineer's tuning and the export's schedule search (:class:`~specrl.policies.engineer.Scorer`)
play hundreds of independent episodes: each is one schedule on one seed of one surrogate env,
and its result depends on nothing else; so are a surrogate comparison's episodes
(:func:`specrl.compare.compare_policies`). Inside :func:`parallel_episodes` they are played by a
pool of worker processes, one per core; outside it, in this process. The results are the
same either way, episode for episode: a worker plays a copy of the env, and every episode
starts from ``reset(seed=...)``.

Each env (or env and policy, for :func:`play_policies`) goes to the workers as a file named by
the digest of its pickled bytes, and a worker keeps what it has read, so an env is read once
per worker, not once per episode.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import pickle
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from specrl.errors import SpecrlError

_pool: tuple[ProcessPoolExecutor, str] | None = None
"""The pool of the outermost :func:`parallel_episodes` block with more than one worker, and
the folder its envs are written to."""

_WORKER_OBJECTS: dict[str, object] = {}
"""In a worker: the envs (and env, policy pairs) it has read, by file."""
_WORKER_OBJECT_LIMIT = 32


WORKERS_ENV = "SPECRL_WORKERS"
"""An environment variable: the workers of :func:`parallel_episodes` when it is given none
(1: play in the calling process)."""


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_workers() -> int:
    """``$SPECRL_WORKERS`` when set, else one worker per usable core."""
    given = os.environ.get(WORKERS_ENV)
    if given is None or given == "":
        return usable_cores()
    try:
        return int(given)
    except ValueError:
        raise SpecrlError(
            f"{WORKERS_ENV}={given!r}: give a whole number of worker processes (1 plays "
            "surrogate episodes in the calling process), or unset it for one per core"
        ) from None


@contextmanager
def parallel_episodes(workers: int | None = None):
    """Inside this block, :func:`play_schedules` and :func:`play_policies` play on
    ``workers`` processes (None: :func:`default_workers`); with one worker they play in this
    process. Blocks nest: an inner block uses the outer one's pool. The workers start at the
    first episodes played."""
    global _pool
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise SpecrlError(f"workers: {workers}; give 1 or more (1 plays in this process)")
    if _pool is not None or workers == 1:
        yield
        return
    # forkserver: the workers start from a clean process, not a fork of one that holds
    # torch's, wandb's or tqdm's threads.
    context = multiprocessing.get_context("forkserver")
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_worker)
    with tempfile.TemporaryDirectory(prefix="specrl-episodes-") as folder:
        _pool = (pool, folder)
        try:
            yield
        finally:
            _pool = None
            pool.shutdown(wait=True, cancel_futures=True)


def _init_worker() -> None:
    # One thread per worker: the pool already has one worker per core.
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:  # pragma: no cover - torch is a dependency
        pass


def play_one(env, dense: np.ndarray, seed: int):
    """One episode of the schedule ``dense`` (K per batch size ``0..max_batch``) on ``env``."""
    from specrl.envs.rollout import run_episode
    from specrl.policies.schedule import BatchSchedule

    schedule = BatchSchedule(dense, max_batch=env.max_batch, k_max=env.k_max)
    return run_episode(env, schedule, seed=seed)


def play_schedules(tasks: Sequence[tuple[object, np.ndarray, int]]) -> list:
    """The :class:`~specrl.envs.EpisodeResult` of each ``(env, dense, seed)`` of ``tasks``, in
    order: on the pool inside :func:`parallel_episodes`, else here."""
    if _pool is None or len(tasks) < 2:
        return [play_one(env, dense, seed) for env, dense, seed in tasks]
    files = _files([env for env, _, _ in tasks])
    return _gather(
        [
            _pool[0].submit(_worker_schedule, files[id(env)], np.asarray(dense), int(seed))
            for env, dense, seed in tasks
        ]
    )


def play_policies(tasks: Sequence[tuple[object, object, int]]) -> list:
    """The :class:`~specrl.envs.EpisodeResult` of each ``(env, policy, seed)`` of ``tasks``
    (policy: anything :func:`~specrl.envs.rollout.run_episode` plays), in order: on the pool
    inside :func:`parallel_episodes`, else here. Each env and policy go to the workers
    together, so a policy that holds its env (the oracle reads the surrogate's hidden rates)
    plays the copy it holds; a policy that starts afresh at each episode
    (``episode_start``, as SB3 passes it) plays the same episodes either way."""
    from specrl.envs.rollout import run_episode

    if _pool is None or len(tasks) < 2:
        return [run_episode(env, policy, seed=seed) for env, policy, seed in tasks]
    pairs = {(id(env), id(policy)): (env, policy) for env, policy, _ in tasks}
    files = _files(list(pairs.values()), skip_unpicklable=True)
    futures = [
        _pool[0].submit(_worker_policy, files[key], int(seed))
        if (key := id(pairs[id(env), id(policy)])) in files
        else None
        for env, policy, seed in tasks
    ]
    # A policy that cannot be pickled (one holding an SB3 model, say) plays here meanwhile.
    here = [
        run_episode(env, policy, seed=seed) if f is None else None
        for f, (env, policy, seed) in zip(futures, tasks, strict=True)
    ]
    pooled = _gather([f for f in futures if f is not None])[::-1]
    return [pooled.pop() if r is None else r for r in here]


def _files(objects: list, *, skip_unpicklable: bool = False) -> dict[int, str]:
    """Each object of ``objects`` written once to the pool's folder, named by the digest of its
    pickled bytes: ``{id(object): path}``; with ``skip_unpicklable``, an object pickle refuses
    is left out. A worker reads each file once."""
    folder = Path(_pool[1])
    files: dict[int, str] = {}
    for obj in objects:
        if id(obj) not in files:
            try:
                blob = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            except (pickle.PicklingError, TypeError, AttributeError):
                if not skip_unpicklable:
                    raise
                continue
            path = folder / f"{hashlib.sha256(blob).hexdigest()}.pkl"
            if not path.exists():
                path.write_bytes(blob)
            files[id(obj)] = str(path)
    return files


def _gather(futures: list) -> list:
    try:
        return [f.result() for f in futures]
    except BrokenProcessPool as err:
        raise SpecrlError(
            f"a worker playing surrogate episodes died ({err}); set {WORKERS_ENV}=1 to play "
            "them in this process"
        ) from None


def _worker_object(path: str):
    """In a worker: the object pickled at ``path``, read once (the most recent
    :data:`_WORKER_OBJECT_LIMIT` are kept)."""
    obj = _WORKER_OBJECTS.pop(path, None)
    if obj is None:
        obj = pickle.loads(Path(path).read_bytes())
    _WORKER_OBJECTS[path] = obj  # most recent last
    while len(_WORKER_OBJECTS) > _WORKER_OBJECT_LIMIT:
        _WORKER_OBJECTS.pop(next(iter(_WORKER_OBJECTS)))
    return obj


def _worker_schedule(path: str, dense: np.ndarray, seed: int):
    return play_one(_worker_object(path), dense, seed)


def _worker_policy(path: str, seed: int):
    from specrl.envs.rollout import run_episode

    env, policy = _worker_object(path)
    return run_episode(env, policy, seed=seed)
