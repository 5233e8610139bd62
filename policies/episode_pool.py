"""Surrogate episodes of fixed schedules played on every core.

The engineer's tuning and the export's schedule search (:class:`~specrl.policies.engineer.Scorer`)
play hundreds of independent episodes: each is one schedule on one seed of one surrogate env,
and its result depends on nothing else. Inside :func:`parallel_episodes` they are played by a
pool of worker processes, one per core; outside it, in this process. The results are the
same either way, episode for episode: a worker plays a copy of the env, and every episode
starts from ``reset(seed=...)``.

Each env goes to the workers as a file named by the digest of its pickled bytes, and a worker
keeps the envs it has read, so an env is read once per worker, not once per episode.
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

_WORKER_ENVS: dict[str, object] = {}
"""In a worker: the envs it has read, by file (the most recent :data:`_WORKER_ENV_LIMIT`)."""
_WORKER_ENV_LIMIT = 16


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
    """Inside this block, :func:`play_schedules` plays on ``workers`` processes (None:
    :func:`default_workers`); with one worker it plays in this process. Blocks nest: an inner
    block uses the outer one's pool. The workers start at the first episodes played."""
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
    pool, folder = _pool
    files: dict[int, str] = {}
    for env, _, _ in tasks:
        if id(env) not in files:  # each env goes to the workers as a file, read once by each
            blob = pickle.dumps(env, protocol=pickle.HIGHEST_PROTOCOL)
            path = Path(folder) / f"env-{hashlib.sha256(blob).hexdigest()}.pkl"
            if not path.exists():
                path.write_bytes(blob)
            files[id(env)] = str(path)
    futures = [
        pool.submit(_worker_play, files[id(env)], np.asarray(dense), int(seed))
        for env, dense, seed in tasks
    ]
    try:
        return [f.result() for f in futures]
    except BrokenProcessPool as err:
        raise SpecrlError(
            f"a worker playing surrogate episodes died ({err}); set {WORKERS_ENV}=1 to play "
            "them in this process"
        ) from None


def _worker_play(path: str, dense: np.ndarray, seed: int):
    env = _WORKER_ENVS.pop(path, None)
    if env is None:
        env = pickle.loads(Path(path).read_bytes())
    _WORKER_ENVS[path] = env  # most recent last
    while len(_WORKER_ENVS) > _WORKER_ENV_LIMIT:
        _WORKER_ENVS.pop(next(iter(_WORKER_ENVS)))
    return play_one(env, dense, seed)
