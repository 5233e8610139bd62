"""What a PPO training run is: :class:`TrainConfig`, and the files a run directory holds.

A run directory (``RUN_DIR``)::

    config.json              the TrainConfig, written when the run starts
    model.zip                the run's policy: the best-evaluated model, copied from
                             best_model.zip when the run finishes
    best_model.zip           the best-evaluated model so far (while training)
    last_model.zip           the weights at the end of training
    summary.json             final evaluation, evaluation history, timing
    checkpoints/step-N/      model.zip (with the optimizer), state.json (timestep count,
                             config, RNG state, reward-normalisation statistics) and, for a
                             surrogate run, envs.pkl (its training envs mid-episode)
    tb/                      tensorboard event files
    wandb/                   the wandb run (offline by default)

Light on purpose (no SB3, torch or wandb): :class:`specrl.policies.ppo.PPOPolicy` reads a
run directory through it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Annotated

from specrl.dataclass_cli import comma_list, one_of, optional, value
from specrl.errors import SpecrlError
from specrl.features import ACCEPTANCE_ESTIMATES, checked_estimate
from specrl.files import check_header, read_json, write_json
from specrl.options import (
    BATCH,
    K_MAX,
    N_REQUESTS,
    SEED,
    THREADS,
    WANDB_MODES,
    float_in,
    int_in,
    model_preset,
    nonnegative_int,
    positive_int,
    workload_preset,
)
from specrl.policy_names import parse_policies
from specrl.seeds import EVAL_SEED
from specrl.workload import capped_workloads, is_preset

CONFIG_FILE = "config.json"
MODEL_FILE = "model.zip"
"""The run's policy: the evaluated model with the best mean ratio to the best static K."""
BEST_MODEL_FILE = "best_model.zip"
"""The best evaluated model so far (while training; copied to MODEL_FILE at the end)."""
LAST_MODEL_FILE = "last_model.zip"
"""The weights at the end of training."""
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "checkpoints"
ENVS_FILE = "envs.pkl"
"""In a surrogate run's checkpoint: its training envs as they stood, mid-episode."""
CONFIG_FORMAT = "specrl-train-config"
CONFIG_VERSION = 2

DEFAULT_WORKLOADS = (
    "mixed",
    "ramp",
    "day",
    "bursts",
    "steady-1",
    "steady-8",
    "steady-64",
    "steady-128",
)
"""The training mix: one drawn per episode, uniformly. The steady workloads hold each batch
size long enough to learn it; the day-shaped ones sweep batch sizes within an episode. A
steady workload above ``max_batch`` serves at ``max_batch`` and counts once
(:func:`~specrl.workload.capped_workloads`): at 32 rows the mix is mixed, ramp, day, bursts,
steady-1, steady-8 and steady-32."""
DEFAULT_EVAL_WORKLOADS = ("ramp", "day", "bursts")
RESUMABLE_CHANGES = ("total_timesteps", "wandb", "out", "checkpoint_every")
"""Fields a resumed run may change; any other difference from the checkpoint is refused."""


@dataclass(frozen=True)
class TrainConfig:
    """One PPO training run on the surrogate; every field is checked when it is made. Each field
    is also an option of ``specrl train`` and ``experiments/train_ppo.py`` (read through
    :mod:`specrl.dataclass_cli`), its docstring the option's help."""

    out: str = "runs/ppo"
    """Run directory: checkpoints, logs, the models (see the module) and summary.json go there."""
    total_timesteps: Annotated[int, value(positive_int)] = 200_000
    """Env steps to train for, over all envs. A resumed run continues up to it."""
    seed: Annotated[int, value(SEED)] = 0
    """Seeds the model, the global RNGs and training env ``i`` (``seed + i``); each env then
    draws every episode's workload and trace from its own stream."""
    env: Annotated[str, value(one_of("surrogate", "live"))] = "surrogate"
    """Where PPO trains: "surrogate" (SurrogateSpec-v0, thousands of steps/s) or "live"
    (LiveSpec-v0: the real engine on this machine, one env, its measured step times). The
    held-out evaluation runs in the surrogate either way."""
    preset: Annotated[str, value(model_preset)] = "small"
    """The default pair the live env serves with (env="live")."""
    init: str | None = None
    """A finished run to start from (its model.zip) instead of a new network: fine-tuning a
    surrogate-trained policy live. The warm start is skipped."""
    force_profile: bool = False
    """env="live": use a profile measured elsewhere, or stale, with a warning."""
    acceptance_estimate: Annotated[str, value(one_of(*ACCEPTANCE_ESTIMATES))] = "usable"
    """What the observation's acceptance is: "usable" (default: pooled from each request's
    posterior over its own accepted runs, :mod:`specrl.posterior`, each row's draft
    positions cut where its tokens left end), "requests" (the same, uncut) or "steps" (the
    step EMA over the batch's drafted tokens). Both envs compute each, and so does the
    LookupController of a table ``specrl export`` writes from the run: a per-request figure
    from each request's temperature, ``max_tokens`` and accepted runs, which the serving
    loop passes it; "steps" from the batch's totals alone. The per-request figures need the
    profile's acceptance levels of this pair (docs/training.md)."""
    workloads: Annotated[tuple[str, ...], comma_list(workload_preset)] = DEFAULT_WORKLOADS
    """Workload presets drawn per episode (uniformly) for training."""
    n_requests: Annotated[int | None, optional(N_REQUESTS)] = None
    """Requests per preset trace; None: the preset's own (``4 x`` its peak concurrency for
    the closed-loop presets)."""
    profile: str | None = None
    """Hardware profile JSON; None: the one shipped with specrl."""
    max_batch: Annotated[int, value(BATCH)] = 128
    """Largest number of rows a step decodes (also the workloads' peak concurrency)."""
    max_len: Annotated[int, value(positive_int)] = 384
    """Longest request, prompt plus output tokens (raise it for a profile of long prompts)."""
    k_max: Annotated[int, value(K_MAX)] = 4
    """Largest K; actions are 0..k_max (0: speculation off)."""
    n_envs: Annotated[int, value(positive_int)] = 8
    """Training envs stepped together (a DummyVecEnv: one process)."""
    n_steps: Annotated[int, value(positive_int)] = 256
    """Steps per env per PPO rollout; a rollout is ``n_steps * n_envs`` steps."""
    batch_size: Annotated[int, value(int_in(2))] = 256
    """PPO minibatch size."""
    n_epochs: Annotated[int, value(positive_int)] = 10
    """Passes over each rollout per update."""
    gamma: Annotated[float, value(float_in(0.0, 1.0, low_open=True))] = 0.99
    """Discount per step. K looks myopic, but turning speculation on after K=0 steps costs a
    draft catch-up that later steps at K > 0 repay, so the return looks many steps ahead."""
    gae_lambda: Annotated[float, value(float_in(0.0, 1.0, low_open=True))] = 0.95
    """GAE lambda."""
    ent_coef: Annotated[float, value(float_in(0.0, 1.0))] = 0.01
    """Entropy bonus: keeps every K tried while the per-step differences are small."""
    learning_rate: Annotated[float, value(float_in(0.0, 1.0, low_open=True))] = 3e-4
    """Adam learning rate (constant)."""
    net_arch: Annotated[tuple[int, ...], comma_list(positive_int)] = (64, 64)
    """Hidden layer widths of the policy and value networks (separate networks)."""
    reward_reference: Annotated[str, value(one_of("batch", "workload"))] = "batch"
    """Whose rate a step's seconds are charged at: "batch" (the rate reached at the step's
    batch size, reward divided by the batch size) or "workload" (the rate reached on the
    episode's workload, every second of an episode charged alike, reward divided by
    max_batch)."""
    shape_catchup: bool = True
    """Potential-based shaping (Ng et al., 1999) with the draft's catch-up debt:
    ``Phi(s) = -rho(B) / B * catchup_seconds(rows behind, widest lag)``, the reward plus
    ``gamma * Phi(s') - Phi(s)``. Without it a catch-up is charged whole to the step that
    drafts again, often at a smaller batch, where ``rho(B) / B`` weighs a second up to 30x
    more than at 128 rows where the K=0 steps ran; K=0 at large batches then looks bad.
    Shaping by a potential keeps the optimal policy; it charges each K=0 step the growth of
    the debt at the batch size it ran at."""
    warm_start: str = "oracle"
    """A controller (a ``specrl compare`` policy name, "none" for no warm start) whose choices
    the policy network imitates before PPO starts: behaviour cloning on the states the
    controller visits, ``warm_start_episodes`` episodes of each training workload. Why: K=0
    pays at large batches only when held, because the step after K=0 that drafts again pays
    the draft's catch-up on every skipped token. PPO explores one step at a time, each K=0
    among K>0 steps looks bad, and a run from scratch rarely learns K=0. The oracle holds K=0
    where it pays; PPO then improves on it (the oracle is myopic)."""
    reference_floor: bool = True
    """With a warm start, ``reward_reference="batch"`` and env="surrogate" (a live run keeps no
    floor; a fine-tune keeps its source run's only where all three hold): the reference never
    reads below the decode tokens/s the warm start's teacher reached at each batch size (where
    it ran 32 steps or more). Why: the reference follows the rate of the *exploring* policy,
    which at large batches can sit below both K=0 and K=1, and a reference below the best rate
    pays for long steps: K=1 out-earns K=0 there, and K=0 is unlearned. The floor keeps the
    reference at a rate the policy has shown it can reach."""
    warm_start_episodes: Annotated[int, value(positive_int)] = 16
    """Episodes of each training workload the warm start's teacher plays (its states are
    what the network imitates). Why several: the oracle's choice between K=1 and off flips
    within a few rows of batch size, and one episode per workload holds only a few dozen
    states near the flip, too few for the network to place it."""
    warm_start_epochs: Annotated[int, value(positive_int)] = 60
    """Passes of behaviour cloning over the warm start's states."""
    normalize_reward: bool = False
    """Scale rewards by a running estimate of the discounted return's spread (SB3
    VecNormalize, observations left as they are); its statistics are checkpointed."""
    checkpoint_every: Annotated[int, value(positive_int)] = 50_000
    """Env steps between checkpoints, taken at the first rollout boundary past each
    multiple; a killed run loses at most this much plus one rollout."""
    eval_every: Annotated[int, value(nonnegative_int)] = 25_000
    """Env steps between held-out evaluations (0: only the final one). Every evaluation is a
    candidate for the run's model: ``model.zip`` is the evaluated model with the best mean
    ratio to the best static K (SB3's ``EvalCallback`` keeps a best model the same way).
    Why: after the warm start, longer training can drift away from K=0 at large batches, so
    the last weights are not always the best."""
    eval_workloads: Annotated[tuple[str, ...], comma_list(workload_preset)] = DEFAULT_EVAL_WORKLOADS
    """Workload presets of the held-out evaluation."""
    eval_episodes: Annotated[int, value(positive_int)] = 4
    """Episodes per evaluation workload. The run's model is the best-evaluated one, so the
    evaluation picks it: on one episode a workload the pick follows that episode's draws of
    arrivals and acceptance as much as the model (docs/training.md)."""
    eval_seed: Annotated[int, value(SEED)] = EVAL_SEED
    """Evaluation episode ``i`` is reset with ``eval_seed + i``: far from the training
    envs' seeds, so evaluation never replays a training stream."""
    wandb: Annotated[str, value(one_of(*WANDB_MODES))] = "offline"
    """wandb mode: offline (the default; no account needed), online or disabled."""
    torch_threads: Annotated[int, value(THREADS)] = 1
    """torch intra-op threads; the networks are tiny, so more threads only add overhead."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "workloads", tuple(self.workloads))
        object.__setattr__(self, "eval_workloads", tuple(self.eval_workloads))
        object.__setattr__(self, "net_arch", tuple(self.net_arch))
        # In this order: the first field found wrong is the one the error names.
        self._check_counts()
        self._check_paths()
        self._check_workloads()
        for name in ("workloads", "eval_workloads"):
            object.__setattr__(self, name, capped_workloads(getattr(self, name), self.max_batch))
        self._check_ppo()
        self._check_env()
        self._check_reward_and_warm_start()
        if self.wandb not in WANDB_MODES:
            raise SpecrlError(f"wandb must be one of {', '.join(WANDB_MODES)}, got {self.wandb!r}")
        self._check_eval_seeds_apart()

    def _check_counts(self) -> None:
        """The integer fields: counts from 1, seeds from 0."""
        for name in (
            "total_timesteps",
            "max_batch",
            "max_len",
            "n_envs",
            "n_steps",
            "batch_size",
            "n_epochs",
            "checkpoint_every",
            "eval_episodes",
            "torch_threads",
        ):
            _check_int(self, name, low=1)
        _check_int(self, "seed", low=0)
        _check_int(self, "k_max", low=1)
        _check_int(self, "eval_every", low=0)
        _check_int(self, "eval_seed", low=0)
        if self.n_requests is not None:
            _check_int(self, "n_requests", low=1)

    def _check_paths(self) -> None:
        """``out`` is a directory path; ``profile`` a path or None."""
        if not isinstance(self.out, str) or not self.out:
            raise SpecrlError(f"out must be a directory path, got {self.out!r}")
        if self.profile is not None and (not isinstance(self.profile, str) or not self.profile):
            raise SpecrlError(f"profile must be a path or None, got {self.profile!r}")

    def _check_workloads(self) -> None:
        """Training and evaluation each name at least one workload preset."""

        for name in ("workloads", "eval_workloads"):
            names = getattr(self, name)
            bad = [w for w in names if not isinstance(w, str) or not is_preset(w)]
            if not names or bad:
                raise SpecrlError(
                    f"{name} must be a non-empty list of workload presets (mixed, ramp, day, "
                    f"bursts, steady-N, poisson); got {list(names)!r}"
                )

    def _check_ppo(self) -> None:
        """The network, the minibatch, PPO's coefficients and the warm start's sizes."""
        if not self.net_arch or not all(
            isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in self.net_arch
        ):
            raise SpecrlError(f"net_arch must be positive layer widths, got {self.net_arch!r}")
        rollout = self.n_steps * self.n_envs
        if not 2 <= self.batch_size <= rollout:
            raise SpecrlError(
                f"batch_size must be in 2..n_steps * n_envs ({rollout}), got {self.batch_size}"
            )
        for name, low, high in (
            ("gamma", 0.0, 1.0),
            ("gae_lambda", 0.0, 1.0),
            ("ent_coef", 0.0, 1.0),
            ("learning_rate", 0.0, 1.0),
        ):
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not ok or not low <= value <= high or (name != "ent_coef" and value == 0):
                raise SpecrlError(f"{name} must be a number in ({low}, {high}], got {value!r}")
        _check_int(self, "warm_start_episodes", low=1)
        _check_int(self, "warm_start_epochs", low=1)

    def _check_env(self) -> None:
        """The training env, the run to start from and the model preset."""
        if self.env not in ("surrogate", "live"):
            raise SpecrlError(f"env must be 'surrogate' or 'live', got {self.env!r}")
        checked_estimate(self.acceptance_estimate)
        if self.env == "live" and self.n_envs != 1:
            raise SpecrlError(
                f"env='live' trains on one engine: n_envs must be 1, got {self.n_envs}"
            )
        if self.init is not None and (not isinstance(self.init, str) or not self.init):
            raise SpecrlError(f"init must be a run directory or None, got {self.init!r}")
        if not isinstance(self.preset, str) or not isinstance(self.force_profile, bool):
            raise SpecrlError("preset must be a preset name and force_profile true or false")
        from specrl.models.build import get_preset

        get_preset(self.preset)  # unknown: names the presets

    def _check_reward_and_warm_start(self) -> None:
        """The reward's switches and the warm start's policy."""
        if not isinstance(self.shape_catchup, bool):
            raise SpecrlError(f"shape_catchup must be true or false, got {self.shape_catchup!r}")
        if self.reward_reference not in ("batch", "workload"):
            raise SpecrlError(
                f"reward_reference must be 'batch' or 'workload', got {self.reward_reference!r}"
            )
        if not isinstance(self.warm_start, str) or not self.warm_start:
            raise SpecrlError(
                f"warm_start must be a policy name (oracle, goodput, threshold:K:B, ...) or "
                f"'none', got {self.warm_start!r}"
            )
        if self.warm_start != "none":
            if len(parse_policies(self.warm_start)) != 1:
                raise SpecrlError(f"warm_start names one policy, got {self.warm_start!r}")
        if not isinstance(self.reference_floor, bool):
            raise SpecrlError(
                f"reference_floor must be true or false, got {self.reference_floor!r}"
            )
        if not isinstance(self.normalize_reward, bool):
            raise SpecrlError(
                f"normalize_reward must be true or false, got {self.normalize_reward!r}"
            )

    def _check_eval_seeds_apart(self) -> None:
        """Evaluation's seeds never replay a training env's stream."""
        train_seeds = range(self.seed, self.seed + self.n_envs)
        eval_seeds = range(self.eval_seed, self.eval_seed + self.eval_episodes)
        if set(train_seeds) & set(eval_seeds):
            raise SpecrlError(
                f"eval seeds {eval_seeds.start}..{eval_seeds.stop - 1} overlap the training "
                f"envs' seeds {train_seeds.start}..{train_seeds.stop - 1}; move eval_seed away "
                f"(default {EVAL_SEED})"
            )

    @property
    def rollout_steps(self) -> int:
        """Env steps per PPO update: ``n_steps * n_envs``."""
        return self.n_steps * self.n_envs

    def to_json(self) -> dict:
        return {"format": CONFIG_FORMAT, "version": CONFIG_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, obj, source: str = "config") -> TrainConfig:
        """Validate a decoded config; unknown or missing fields reject it whole. Version 1
        runs are refused: their policies observed the acceptance as accepted / drafted, not
        the per-token acceptance (:class:`~specrl.features.AcceptanceTracker`) that tables
        and environments now hold."""
        check_header(
            obj,
            source,
            fmt=CONFIG_FORMAT,
            version=CONFIG_VERSION,
            what="training config",
            remake=(
                "start a new run with `specrl train --out RUN_DIR` (version 1 runs observed "
                "the acceptance as accepted / drafted, which this specrl no longer computes)"
            ),
        )
        names = {f.name for f in fields(cls)}
        given = set(obj) - {"format", "version"}
        if given != names:
            unknown, missing = sorted(given - names), sorted(names - given)
            raise SpecrlError(f"{source}: unknown fields {unknown}, missing fields {missing}")
        try:
            return cls(**{name: obj[name] for name in names})
        except SpecrlError as err:
            raise SpecrlError(f"{source}: {err}") from None
        except TypeError as err:  # a list where a number belongs, and the like
            raise SpecrlError(f"{source}: {err}") from None

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_json())

    def changes_from(self, other: TrainConfig) -> list[str]:
        """Names of the fields that differ from ``other``."""
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]

    def unresumable_changes_from(self, other: TrainConfig) -> list[str]:
        """Names of the fields that differ from ``other`` and a resumed run may not change
        (all but :data:`RESUMABLE_CHANGES`): a run of ``other`` is not this one."""
        return [name for name in self.changes_from(other) if name not in RESUMABLE_CHANGES]


def load_config(run_dir: str | Path) -> TrainConfig:
    """The config of the run in ``run_dir`` (its ``config.json``)."""
    path = Path(run_dir) / CONFIG_FILE
    if Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise SpecrlError(
            f"{run_dir} is a file, not a run directory; give the directory `specrl train --out` "
            "wrote (it holds config.json and model.zip)"
        )
    if not Path(run_dir).is_dir():
        raise SpecrlError(
            f"run directory {run_dir} not found; train one with `specrl train --out {run_dir}`"
        )
    obj = read_json(path, "training config", f"is {run_dir} a `specrl train` run directory?")
    return TrainConfig.from_json(obj, source=str(path))


def _check_int(config: TrainConfig, name: str, *, low: int) -> None:
    value = getattr(config, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise SpecrlError(f"{name} must be an integer >= {low}, got {value!r}")
