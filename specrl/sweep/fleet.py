"""Fleet profiling: each kind of accelerator measures its own profile, placed there by Ray.

A profile holds only on the machine that measured it, so a fleet of several GPU types needs
one profile per (pair, accelerator type), and the tables follow. :func:`profile_fleet` runs one
Ray task per :class:`FleetJob`, and Ray places it by resources:

* a **custom resource** (``by="resource"``, the default): the nodes of one kind join with
  ``ray start --address HEAD:6379 --resources '{"accel:H200": 1}'`` and the task asks for 1 of
  it, so a node of that kind runs one profile at a time (two would time each other);
* a **Ray accelerator type** (``by="accelerator_type"``): Ray's own ``accelerator_type=``
  option, the type Ray detects on a GPU node (``"H200"``, ``"A100"``: the names in
  :mod:`ray.util.accelerators`); the task also asks for one GPU.

The task loads the pair on the node it lands on, measures it with
:func:`~specrl.profile.measure.measure_profile`, records where (``meta.fleet``: the
accelerator, the resource that placed it, the resources Ray assigned, the node's hostname, Ray
node id and IP; the fingerprint already names the device) and returns the profile as JSON. The
driver validates it and writes ``OUT/profile-<pair>-<accelerator>.json``.

Ray is imported inside the functions that use it: importing specrl never imports Ray.
"""

from __future__ import annotations

import inspect
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specrl.errors import SpecrlError
from specrl.files import check_output
from specrl.models.build import get_preset
from specrl.models.pair import ModelPair, load_default_pair, load_pair
from specrl.profile.measure import check_settings, measure_profile
from specrl.profile.schema import profile_from_json
from specrl.sweep.cluster import last_line, ray_session

SCHEDULED_BY = ("resource", "accelerator_type")
"""How a job names where it runs: a custom resource, or a Ray accelerator type."""

GRID_FIELDS = (
    "k_max",
    "batch_sizes",
    "contexts",
    "reps",
    "seed",
    "acceptance_rows",
    "acceptance_tokens",
)
"""The settings of :func:`~specrl.profile.measure.measure_profile` a job's ``grid`` may set."""

ACCELERATOR_TYPE_PREFIX = "accelerator_type:"
"""Ray's resource for ``accelerator_type=X`` is ``accelerator_type:X`` (Ray's own spelling)."""


@dataclass
class FleetJob:
    """One profile to measure: a pair, on one kind of accelerator, over a grid."""

    accelerator: str
    """Where it runs: a custom resource the nodes of that kind advertise (``"accel:H200"``),
    or with ``by="accelerator_type"`` a Ray accelerator type (``"H200"``)."""
    preset: str | None = None
    """A default pair (``"small"``, ``"micro"``), built or taken from the shipped weights on
    the node; or give ``target`` and ``draft``."""
    target: str | None = None
    """The target: a Hugging Face id, or a directory every node of that kind has."""
    draft: str | None = None
    """The draft sharing the target's vocabulary."""
    name: str | None = None
    """The pair's name in the file written (default: the preset, or the target's and the
    draft's last path parts)."""
    by: str = "resource"
    """``"resource"`` or ``"accelerator_type"`` (:data:`SCHEDULED_BY`)."""
    device: str | None = None
    """The torch device the engine runs on (default: ``"cuda"`` with ``by="accelerator_type"``,
    else ``"cpu"``); a CUDA device makes the task ask Ray for one GPU."""
    threads: int = 1
    """Torch threads, and the CPUs the task asks Ray for (the profile holds at this count)."""
    grid: dict = field(default_factory=dict)
    """Settings passed to :func:`~specrl.profile.measure.measure_profile`, any of
    :data:`GRID_FIELDS`; the rest keep its defaults."""

    def __post_init__(self) -> None:
        if self.by not in SCHEDULED_BY:
            raise SpecrlError(
                f"fleet job {self.accelerator!r}: by must be one of {', '.join(SCHEDULED_BY)}, "
                f"got {self.by!r}"
            )
        if not self.accelerator or not isinstance(self.accelerator, str):
            raise SpecrlError(f"fleet job: accelerator must be a name, got {self.accelerator!r}")
        if bool(self.target) != bool(self.draft):
            raise SpecrlError(f"{self.label}: give target and draft together")
        if bool(self.preset) == bool(self.target):
            raise SpecrlError(f"{self.label}: give preset (a default pair) or target and draft")
        if self.preset:
            get_preset(self.preset)
        if self.device is None:
            self.device = "cuda" if self.by == "accelerator_type" else "cpu"
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1:
            raise SpecrlError(
                f"{self.label}: threads must be an integer >= 1, not {self.threads!r}"
            )
        unknown = sorted(set(self.grid) - set(GRID_FIELDS))
        if unknown:
            raise SpecrlError(
                f"{self.label}: unknown grid setting(s) {', '.join(unknown)}; "
                f"known: {', '.join(GRID_FIELDS)}"
            )
        s = {**_measure_defaults(), **self.grid}
        check_settings(s["k_max"], s["batch_sizes"], s["contexts"], s["reps"], s["acceptance_rows"])

    @property
    def pair_name(self) -> str:
        if self.name:
            return self.name
        if self.preset:
            return self.preset
        return f"{Path(str(self.target)).name}_{Path(str(self.draft)).name}"

    @property
    def label(self) -> str:
        """The job as its messages name it."""
        pair = self.name or self.preset
        if not pair and (self.target or self.draft):
            pair = f"{self.target} / {self.draft}"
        return f"fleet job {pair + ' ' if pair else ''}on {self.accelerator}"

    @property
    def resource(self) -> str:
        """The Ray resource that places the task."""
        if self.by == "accelerator_type":
            return ACCELERATOR_TYPE_PREFIX + self.accelerator
        return self.accelerator

    def file_name(self) -> str:
        return f"profile-{_file_part(self.pair_name)}-{_file_part(self.accelerator)}.json"

    @property
    def gpus(self) -> int:
        return 1 if self.device.startswith("cuda") else 0

    def ray_options(self) -> dict:
        """The options of the job's Ray task: its CPUs, its GPU, and where it may run."""
        options = {"num_cpus": self.threads, "num_gpus": self.gpus}
        if self.by == "accelerator_type":
            options["accelerator_type"] = self.accelerator
        else:
            options["resources"] = {self.accelerator: 1}
        return options

    def needs(self) -> dict[str, float]:
        """The resources one node must have for the task, as Ray counts them (an accelerator
        type asks for a token 0.001 of its resource)."""
        needs = {"CPU": self.threads, self.resource: 0.001 if self.by == "accelerator_type" else 1}
        if self.gpus:
            needs["GPU"] = self.gpus
        return needs


@dataclass(frozen=True)
class FleetProfile:
    """A profile measured by :func:`profile_fleet`, written on the driver."""

    path: Path
    accelerator: str
    pair: str
    hostname: str
    """The machine that measured it."""
    node_id: str
    """Its Ray node id."""


def profile_fleet(
    jobs: list[FleetJob],
    out_dir: str | Path,
    *,
    address: str | None = None,
    timeout_s: float | None = None,
) -> list[FleetProfile]:
    """Measure every job's profile on a node of its accelerator; write them under ``out_dir``.

    :param jobs: the profiles to measure; two jobs may not write the same file.
    :param out_dir: where the driver writes ``profile-<pair>-<accelerator>.json``.
    :param address: a Ray cluster's head (``HOST:PORT``, ``ray://HOST:PORT`` or ``auto``);
        None: the Ray session this process has, else Ray started on this machine
        (:func:`~specrl.sweep.cluster.ray_session`; one started here is shut down on return).
    :param timeout_s: give up on the jobs not finished after this long (cancelling them);
        None waits as long as they take (a full profile takes most of an hour on a CPU).

    A job that no node of the cluster can run (no node has its resource, CPUs and GPU) is
    refused before anything is submitted. Profiles are written as they come back; a job that
    fails leaves the others to finish, and then a SpecrlError names every failure.
    Returns one :class:`FleetProfile` per job, in the order of ``jobs``."""
    if not jobs:
        raise SpecrlError("fleet profiling: no jobs given")
    paths = [Path(out_dir) / job.file_name() for job in jobs]
    twice = sorted({p.name for p in paths if paths.count(p) > 1})
    if twice:
        raise SpecrlError(
            f"fleet profiling: more than one job writes {', '.join(twice)}; give each pair on "
            "one accelerator once (or tell them apart with name=)"
        )
    for path in paths:
        check_output(path, "fleet profile")
    with ray_session(address) as ray:
        _check_placeable(jobs, ray.nodes())
        measure = ray.remote(_measure_here)
        pending = {measure.options(**j.ray_options()).remote(j): i for i, j in enumerate(jobs)}
        written, failed = _collect(ray, pending, jobs, paths, timeout_s)
    if failed:
        kept = ", ".join(str(written[i].path) for i in sorted(written))
        raise SpecrlError(
            f"fleet profiling: {len(failed)} of {len(jobs)} job(s) failed: {'; '.join(failed)}"
            + (f"; written: {kept}" if kept else "")
        )
    return [written[i] for i in range(len(jobs))]


def _collect(ray, pending: dict, jobs: list[FleetJob], paths: list[Path], timeout_s):
    """Wait for the tasks in ``pending`` (a task's ref: its job's index), writing each
    profile as it comes back. Returns ``(written, failed)``: the FleetProfile by index, and
    a message per failed job."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    written: dict[int, FleetProfile] = {}
    failed: list[str] = []
    while pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=left)
        if not ready:
            for ref in pending:
                ray.cancel(ref, force=True)
            late = ", ".join(jobs[i].label for i in pending.values())
            raise SpecrlError(
                f"fleet profiling: not finished after {timeout_s} s, cancelled: {late} "
                "(their nodes busy or gone? raise timeout_s, or check `ray status`)"
            )
        i = pending.pop(ready[0])
        try:
            obj = ray.get(ready[0])
        except ray.exceptions.RayError as err:
            failed.append(f"{jobs[i].label}: {last_line(err)}")
            continue
        profile = profile_from_json(obj, source=f"the profile of {jobs[i].label}")
        profile.save(paths[i])
        where = profile.meta["fleet"]
        written[i] = FleetProfile(
            paths[i], jobs[i].accelerator, jobs[i].pair_name, where["hostname"], where["node_id"]
        )
    return written, failed


def _measure_here(job: FleetJob) -> dict:
    """The Ray task: measure ``job``'s profile on this node and return it as JSON, its
    ``meta.fleet`` naming the node and what placed the task here."""
    import ray

    torch.set_num_threads(job.threads)
    profile = measure_profile(
        _load(job), device=job.device, preset=job.preset, progress=False, **job.grid
    )
    context = ray.get_runtime_context()
    profile.meta["fleet"] = {
        "accelerator": job.accelerator,
        "scheduled_by": job.by,
        "resource": job.resource,
        "assigned": context.get_assigned_resources(),
        "hostname": socket.gethostname(),
        "node_id": context.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
    }
    return profile.to_json()


def _load(job: FleetJob) -> ModelPair:
    if job.preset:
        return load_default_pair(job.preset, device=job.device)
    return load_pair(job.target, job.draft, device=job.device)


def _check_placeable(jobs: list[FleetJob], nodes: list[dict]) -> None:
    """Refuse the jobs that no live node can run now: Ray would hold them forever."""
    alive = [n["Resources"] for n in nodes if n.get("Alive")]
    for job in jobs:
        needs = job.needs()
        if any(all(r.get(k, 0) >= v for k, v in needs.items()) for r in alive):
            continue
        kinds = sorted({k for r in alive for k in r if _is_accelerator_kind(k)})
        wanted = ", ".join(f"{k}: {v:g}" for k, v in needs.items())
        if job.by == "accelerator_type":
            join = f"`ray start --address HEAD:6379` on a {job.accelerator} GPU node"
        else:
            join = f"`ray start --address HEAD:6379 --resources '{{\"{job.accelerator}\": 1}}'`"
        raise SpecrlError(
            f"{job.label}: no node of the Ray cluster has {{{wanted}}} (its nodes' accelerator "
            f"resources: {', '.join(kinds) or 'none'}); add one with {join}, or check the "
            "job's accelerator and threads"
        )


def _is_accelerator_kind(resource: str) -> bool:
    """A resource that names a kind of node: a custom one, or Ray's accelerator type."""
    builtin = {"CPU", "GPU", "memory", "object_store_memory"}
    return resource not in builtin and not resource.startswith("node:")


def _measure_defaults() -> dict:
    """:func:`~specrl.profile.measure.measure_profile`'s defaults of :data:`GRID_FIELDS`."""
    params = inspect.signature(measure_profile).parameters
    return {name: params[name].default for name in GRID_FIELDS}


def _file_part(text: str) -> str:
    """``text`` as part of a file name: ``accel:H200`` as ``accel_H200``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "pair"
