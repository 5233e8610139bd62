"""A sweep's spec file, YAML or JSON, as a validated :class:`SweepSpec` and its grid of trials.

::

    name: k-tables                   # the wandb group; default: the spec file's name
    profiles: [specrl/assets/profiles/default-cpu.json]   # relative to the spec file or cwd
    workloads:                       # training mixes, each a list of presets: a trial per mix
      - [ramp, day, bursts, mixed]
    seeds: [0, 1, 2]
    train:                           # any TrainConfig field: a value, or a list = a grid axis
      total_timesteps: 50000
      gamma: [0.99, 0.9]
      net_arch: [[64, 64], [32]]     # a list field: a list of lists is the axis
    compare: {workloads: [ramp, day, bursts, mixed], episodes: 2}
    export: {search: true}           # false: the learned table, the stacks' collapsed (--no-search)
    wandb: offline                   # offline | online | disabled
    fleet:                           # profiles the sweep measures first, one Ray task each
      - {accelerator: "accel:H200", preset: small, device: cuda}
      - {accelerator: A100, by: accelerator_type, target: /models/t, draft: /models/d}

The grid is profiles x workload mixes x train axes x seeds. Every key but ``profiles`` has
the default shown by :data:`DEFAULTS` (``profiles``: the profile shipped with specrl, unless
``fleet`` is given). Each ``fleet`` entry is a :class:`~specrl.sweep.fleet.FleetJob` (its
fields are the entry's keys): the sweep measures its profile on a node of its accelerator
before any trial (:func:`specrl.sweep.tune.run_sweep`), writes it to
``OUT/profiles/profile-<pair>-<accelerator>.json``, and that profile joins ``profiles``.
:func:`load_spec` refuses a file whole, naming the key and the fix, for an unknown key, a
field :class:`~specrl.config.TrainConfig` does not have, an empty list (an empty grid), a
profile that does not load, or a value ``TrainConfig`` refuses in any trial: each trial's
config is built here, before anything starts.
"""

from __future__ import annotations

import difflib
import itertools
import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from specrl.config import TrainConfig
from specrl.envs import default_profile_path
from specrl.errors import SpecrlError
from specrl.files import read_json
from specrl.options import WANDB_MODES
from specrl.profile import load_profile
from specrl.sweep.fleet import FleetJob
from specrl.workload import is_preset

DEFAULTS = {
    "name": None,
    "profiles": None,
    "workloads": [["ramp", "day", "bursts", "mixed"]],
    "seeds": [0],
    "train": {},
    "compare": {"workloads": ["ramp", "day", "bursts", "mixed"], "episodes": 2},
    "export": {"search": True},
    "wandb": "offline",
    "fleet": [],
}
"""The spec's keys and their defaults (``name``: the spec file's stem; ``profiles``: the
profile shipped with specrl, or none when ``fleet`` is given)."""
FLEET_KEYS = tuple(f.name for f in fields(FleetJob))
"""The keys of a ``fleet`` entry: :class:`~specrl.sweep.fleet.FleetJob`'s fields."""
PROFILES_DIR = "profiles"
"""Where in the sweep's folder the ``fleet`` profiles are written."""
SET_ELSEWHERE = {
    "out": "each trial trains in OUT/trials/<trial>/run",
    "profile": "list the profiles under the top-level key profiles",
    "seed": "list the seeds under the top-level key seeds",
    "workloads": "list the training mixes under the top-level key workloads",
    "wandb": "set the top-level key wandb",
    "torch_threads": "set by --cpus-per-trial",
}
"""TrainConfig fields a spec's ``train`` may not set, and where each is set instead."""
LIST_FIELDS = tuple(f.name for f in fields(TrainConfig) if isinstance(f.default, tuple))
"""TrainConfig fields that hold a list: in ``train`` a list of lists is their grid axis."""
_FIELDS = tuple(f.name for f in fields(TrainConfig))


@dataclass(frozen=True)
class Trial:
    """One point of the grid: what :func:`specrl.sweep.trial.run_trial` trains, exports and
    compares. Plain values only, so it travels to a Ray worker as JSON."""

    name: str
    """``<profile>-<mix>[-<axis values>]-s<seed>``: its directory under ``OUT/trials``."""
    profile: str
    """The profile's absolute path."""
    mix: tuple[str, ...]
    """The training workload mix."""
    seed: int
    settings: dict
    """The values of the train axes (the grid's lists): what tells configurations apart."""
    train: dict
    """Every TrainConfig field the spec sets, with this trial's values."""
    compare_workloads: tuple[str, ...]
    compare_episodes: int
    search: bool
    """Search each stack's best schedule (else collapse the table at one acceptance)."""
    wandb: str
    group: str
    """The sweep's name: the trials' wandb group."""

    @property
    def profile_name(self) -> str:
        return Path(self.profile).stem

    @property
    def mix_name(self) -> str:
        return "+".join(self.mix)

    @property
    def configuration(self) -> str:
        """The trial's name without its seed: the trials of one configuration share it."""
        return self.name.removesuffix(f"-s{self.seed}")

    def config(self, out: str, *, threads: int = 1) -> TrainConfig:
        """The trial's TrainConfig, training in ``out`` with ``threads`` torch threads; its
        own wandb run is the trial's (:mod:`specrl.sweep.trial`), so training logs none."""
        return TrainConfig(
            out=out,
            profile=self.profile,
            seed=self.seed,
            workloads=self.mix,
            wandb="disabled",
            torch_threads=threads,
            **self.train,
        )

    def to_json(self) -> dict:
        return json.loads(json.dumps(self.__dict__))

    @classmethod
    def from_json(cls, obj: dict) -> Trial:
        lists = ("mix", "compare_workloads")
        return cls(**{k: tuple(v) if k in lists else v for k, v in obj.items()})


@dataclass(frozen=True)
class SweepSpec:
    """A validated spec: build it with :func:`load_spec` or :func:`spec_from_json`."""

    name: str
    profiles: tuple[str, ...]
    workloads: tuple[tuple[str, ...], ...]
    seeds: tuple[int, ...]
    train: dict = field(default_factory=dict)
    """TrainConfig field -> its values: one for a fixed setting, several for an axis."""
    axes: tuple[str, ...] = ()
    """The train fields given as lists: the grid's axes besides profiles, mixes and seeds."""
    compare_workloads: tuple[str, ...] = tuple(DEFAULTS["compare"]["workloads"])
    compare_episodes: int = DEFAULTS["compare"]["episodes"]
    search: bool = True
    wandb: str = "offline"
    fleet: tuple[dict, ...] = ()
    """The profiles to measure first: each a :class:`~specrl.sweep.fleet.FleetJob` as JSON."""

    def fleet_jobs(self) -> list[FleetJob]:
        return [FleetJob(**job) for job in self.fleet]

    def fleet_profiles(self, out: str | Path) -> list[str]:
        """Where the sweep in ``out`` writes the ``fleet`` profiles, one per job."""
        where = Path(out).resolve() / PROFILES_DIR
        return [str(where / job.file_name()) for job in self.fleet_jobs()]

    def trials(self, out: str | Path = "OUT") -> list[Trial]:
        """The grid of the sweep in ``out``, profile by profile (``profiles``, then the
        ``fleet`` profiles it measures in ``out``), then mix, then axis values, then seed."""
        names = list(self.train)
        grid = []
        profiles = [*self.profiles, *(self.fleet_profiles(out) if self.fleet else [])]
        for profile, mix, values in itertools.product(
            profiles, self.workloads, itertools.product(*self.train.values())
        ):
            train = dict(zip(names, values))
            settings = {n: train[n] for n in self.axes}
            for seed in self.seeds:
                grid.append(
                    Trial(
                        name=_trial_name(profile, mix, settings, seed),
                        profile=profile,
                        mix=mix,
                        seed=seed,
                        settings=settings,
                        train=train,
                        compare_workloads=self.compare_workloads,
                        compare_episodes=self.compare_episodes,
                        search=self.search,
                        wandb=self.wandb,
                        group=self.name,
                    )
                )
        return grid

    def to_json(self) -> dict:
        return json.loads(json.dumps(self.__dict__))


def load_spec(path: str | Path) -> SweepSpec:
    """The spec in ``path`` (``.yaml``/``.yml``: YAML, else JSON), validated whole (see the
    module); profile paths are read relative to the spec's folder, else the working
    directory."""
    path = Path(path)
    if path.suffix in (".yaml", ".yml"):
        obj = _read_yaml(path)
    else:
        obj = read_json(path, "sweep spec", "give a YAML (.yaml) or JSON spec (docs/sweep.md)")
    return spec_from_json(obj, source=str(path), base=path.parent, name=path.stem)


def spec_from_json(obj, *, source: str, base: str | Path = ".", name: str = "sweep") -> SweepSpec:
    """A decoded spec, validated (``source`` names it in errors; relative profile paths are
    looked up under ``base``, then the working directory; ``name`` is the default name)."""
    if not isinstance(obj, dict):
        raise SpecrlError(f"{source}: expected a mapping of keys ({', '.join(DEFAULTS)})")
    _no_unknown(obj, DEFAULTS, source, "")
    given = {**DEFAULTS, **obj}
    sweep_name = given["name"] if given["name"] is not None else name
    if not isinstance(sweep_name, str) or not sweep_name or "/" in sweep_name:
        raise SpecrlError(f"{source}: name must be a word (no '/'), got {sweep_name!r}")
    compare = _mapping(given["compare"], "compare", source)
    _no_unknown(compare, DEFAULTS["compare"], source, "compare.")
    compare = {**DEFAULTS["compare"], **compare}
    export = _mapping(given["export"], "export", source)
    _no_unknown(export, DEFAULTS["export"], source, "export.")
    export = {**DEFAULTS["export"], **export}
    if not isinstance(export["search"], bool):
        raise SpecrlError(f"{source}: export.search must be true or false")
    if given["wandb"] not in WANDB_MODES:
        raise SpecrlError(
            f"{source}: wandb must be one of {', '.join(WANDB_MODES)}, got {given['wandb']!r}"
        )
    train, axes = _train(given["train"], source)
    fleet = _fleet(given["fleet"], source)
    fleet_only = given["profiles"] is None and bool(fleet)
    spec = SweepSpec(
        name=sweep_name,
        profiles=() if fleet_only else _profiles(given["profiles"], source, Path(base)),
        workloads=_mixes(given["workloads"], source),
        seeds=_seeds(given["seeds"], source),
        train=train,
        axes=axes,
        compare_workloads=tuple(_presets(compare["workloads"], "compare.workloads", source)),
        compare_episodes=_count(compare["episodes"], "compare.episodes", source),
        search=export["search"],
        wandb=given["wandb"],
        fleet=fleet,
    )
    _check_names(spec, source)
    _check_trials(spec, source)
    return spec


def _read_yaml(path: Path):
    try:
        import yaml
    except ModuleNotFoundError:
        raise SpecrlError(
            f"sweep spec {path}: reading YAML needs PyYAML: pip install 'specrl[sweep]' (or "
            "give the spec as JSON)"
        ) from None

    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpecrlError(f"sweep spec {path} not found; give the path of a YAML spec") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise SpecrlError(f"sweep spec {path} is not valid YAML ({err}); fix it") from None


def _no_unknown(obj: dict, known, source: str, prefix: str) -> None:
    for key in obj:
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f"did you mean {prefix}{close[0]}? " if close else ""
            raise SpecrlError(
                f"{source}: unknown key {prefix}{key}; {hint}the keys are "
                + ", ".join(prefix + k for k in known)
            )


def _mapping(value, key: str, source: str) -> dict:
    if not isinstance(value, dict):
        raise SpecrlError(f"{source}: {key} must be a mapping of keys, got {value!r}")
    return value


def _nonempty_list(value, key: str, source: str, what: str) -> list:
    if not isinstance(value, list):
        raise SpecrlError(f"{source}: {key} must be a list of {what}, got {value!r}")
    if not value:
        raise SpecrlError(
            f"{source}: {key} is an empty list, and an empty grid has no trials; give at "
            f"least one of {what}"
        )
    return value


def _distinct(values: list, key: str, source: str) -> None:
    repeated = [v for i, v in enumerate(values) if v in values[:i]]
    if repeated:
        raise SpecrlError(f"{source}: {key} repeats {repeated[0]!r}; list each one once")


def _profiles(value, source: str, base: Path) -> tuple[str, ...]:
    if value is None:
        return (str(default_profile_path()),)
    paths = []
    for i, item in enumerate(_nonempty_list(value, "profiles", source, "profile files")):
        key = f"profiles[{i}]"
        if not isinstance(item, str) or not item:
            raise SpecrlError(f"{source}: {key} must be a profile file's path, got {item!r}")
        found = next((p for p in (base / item, Path(item)) if p.is_file()), None)
        if found is None:
            raise SpecrlError(
                f"{source}: {key}: profile file {item} not found (looked in {base} and the "
                f"working directory); fix the path, or measure one with `specrl profile --out "
                f"{item}`"
            )
        try:
            load_profile(found)
        except SpecrlError as err:
            raise SpecrlError(f"{source}: {key}: {err}") from None
        paths.append(str(found.resolve()))
    _distinct(paths, "profiles", source)
    return tuple(paths)


def _fleet(value, source: str) -> tuple[dict, ...]:
    """``fleet`` as the jobs' JSON, each checked by :class:`FleetJob` (no Ray needed)."""
    if not isinstance(value, list):
        raise SpecrlError(
            f"{source}: fleet must be a list of profiling jobs (mappings of "
            f"{', '.join(FLEET_KEYS)}), got {value!r}"
        )
    jobs = []
    for i, entry in enumerate(value):
        key = f"fleet[{i}]"
        entry = _mapping(entry, key, source)
        _no_unknown(entry, FLEET_KEYS, source, f"{key}.")
        try:
            jobs.append(FleetJob(**entry))
        except SpecrlError as err:
            raise SpecrlError(f"{source}: {key}: {err}") from None
    files = [job.file_name() for job in jobs]
    _distinct(files, "fleet (the profile files its jobs write)", source)
    return tuple(json.loads(json.dumps(job.__dict__)) for job in jobs)


def _check_names(spec: SweepSpec, source: str) -> None:
    """Trials are named by their profile's file name: no two profiles may share one."""
    stems = [Path(p).stem for p in (*spec.profiles, *spec.fleet_profiles("OUT"))]
    twice = [s for i, s in enumerate(stems) if s in stems[:i]]
    if twice:
        raise SpecrlError(
            f"{source}: profiles: two files are named {twice[0]!r} (in profiles or written by "
            "fleet) and the trials are named by the profile's file name; rename one"
        )


def _presets(value, key: str, source: str) -> list[str]:
    names = _nonempty_list(value, key, source, "workload presets")
    bad = [n for n in names if not isinstance(n, str) or not is_preset(n)]
    if bad:
        raise SpecrlError(
            f"{source}: {key}: {bad[0]!r} is not a workload preset (mixed, ramp, day, bursts, "
            "steady-N, poisson)"
        )
    _distinct(names, key, source)
    return names


def _mixes(value, source: str) -> tuple[tuple[str, ...], ...]:
    mixes = _nonempty_list(value, "workloads", source, "training mixes")
    if any(not isinstance(m, list) for m in mixes):
        raise SpecrlError(
            f"{source}: workloads is a list of training mixes, each a list of presets: write "
            "[[ramp, day]] for one mix of two, or [[ramp], [day]] for two mixes"
        )
    out = tuple(tuple(_presets(m, f"workloads[{i}]", source)) for i, m in enumerate(mixes))
    _distinct(list(out), "workloads", source)
    return out


def _seeds(value, source: str) -> tuple[int, ...]:
    seeds = _nonempty_list(value, "seeds", source, "seeds (integers >= 0)")
    if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in seeds):
        raise SpecrlError(f"{source}: seeds must be integers >= 0, got {seeds!r}")
    _distinct(seeds, "seeds", source)
    return tuple(seeds)


def _count(value, key: str, source: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecrlError(f"{source}: {key} must be an integer >= 1, got {value!r}")
    return value


def _train(value, source: str) -> tuple[dict, tuple[str, ...]]:
    """``train`` as field -> its values, and the fields that are axes."""
    train = _mapping(value, "train", source)
    values, axes = {}, []
    for key, given in train.items():
        if key in SET_ELSEWHERE:
            raise SpecrlError(f"{source}: train.{key}: not set here; {SET_ELSEWHERE[key]}")
        if key not in _FIELDS:
            close = difflib.get_close_matches(str(key), _FIELDS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise SpecrlError(
                f"{source}: train.{key}: TrainConfig has no field {key!r}{hint}; its fields "
                "are the options of `specrl train --help`"
            )
        is_axis = isinstance(given, list) and (
            key not in LIST_FIELDS or any(isinstance(v, list) for v in given)
        )
        if isinstance(given, list) and not given:
            raise SpecrlError(
                f"{source}: train.{key} is an empty list, and an empty grid has no trials; "
                "give one value, or a list of the values to try"
            )
        if is_axis:
            _distinct(given, f"train.{key}", source)
            axes.append(key)
        values[key] = tuple(_plain(v) for v in given) if is_axis else (_plain(given),)
    return values, tuple(axes)


def _plain(value):
    """A list field's value as a list (JSON's), anything else as it is."""
    return list(value) if isinstance(value, (list, tuple)) else value


def _trial_name(profile: str, mix: tuple[str, ...], settings: dict, seed: int) -> str:
    parts = [Path(profile).stem, "+".join(mix)]
    parts += [",".join(f"{k}={_text(v)}" for k, v in settings.items())] if settings else []
    return "-".join(parts) + f"-s{seed}"


def _text(value) -> str:
    """A setting's value in a trial's name, which is also a folder's."""
    text = "x".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return text.replace("/", "_")


def _check_trials(spec: SweepSpec, source: str) -> None:
    """Build every trial's TrainConfig: a value TrainConfig refuses, refused now; and no two
    trials may share a folder."""
    trials = spec.trials()
    names = [t.name for t in trials]
    if len(set(names)) != len(names):
        twice = next(n for i, n in enumerate(names) if n in names[:i])
        raise SpecrlError(
            f"{source}: two trials would be named {twice}; give the train values that read "
            "alike (2 and '2', a/b and a_b) apart"
        )
    for trial in trials:
        try:
            trial.config("validation")
        except (SpecrlError, TypeError) as err:
            raise SpecrlError(f"{source}: train: {err} (trial {trial.name})") from None
