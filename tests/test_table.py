"""The exported K table, the serving-side LookupController and the vLLM / TensorRT-LLM exports."""

from __future__ import annotations

import ast
import copy
import json
import math
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import specrl.controller
from specrl.controller import HARD_FINGERPRINT_KEYS, LookupController
from specrl.errors import SpecrlError
from specrl.features import NEVER_MEASURED, STALE_STEPS, AcceptanceTracker
from specrl.table import KTable, load_table, table_from_json
from specrl.table.build import monotone_in_acceptance, table_from_policy
from specrl.table.stacks import export_file
from specrl.table.trtllm import to_trtllm
from specrl.table.vllm import to_vllm

FINGERPRINT = {"device": "cpu: test x2", "target_sha256": "aa", "draft_sha256": "bb", "k_max": 4}
PROVENANCE = {
    "profile_sha256": "0" * 64,
    "profile_fingerprint": FINGERPRINT,
    "target_id": "target",
    "draft_id": "draft",
    "run_id": "run-1",
    "training_steps": 1000,
    "specrl_version": "0.1.0",
    "created": "2026-11-02T10:00:00+00:00",
}


def plain_json() -> dict:
    """Batch 1-4 / 5-8 / 9-16, acceptance [0, .5) [.5, .8) [.8, 1]."""
    return {
        "format": "specrl-k-table",
        "version": 2,
        "k_max": 4,
        "max_batch": 16,
        "batch_buckets": [[1, 4], [5, 8], [9, 16]],
        "acceptance_edges": [0, 0.5, 0.8, 1],
        "k": [[1, 3, 4], [0, 2, 3], [0, 0, 1]],
        "stale_k": [1, 0, 0],
        "probe": {"after_steps": STALE_STEPS, "k": 1},
        "provenance": copy.deepcopy(PROVENANCE),
    }


def context_json() -> dict:
    """The plain table with contexts 1-511 and 512+; long contexts draft one more."""
    obj = plain_json()
    obj["context_bins"] = [[1, 511], [512, None]]
    obj["k"] = [[row, [min(4, k + 1) for k in row]] for row in obj["k"]]
    obj["stale_k"] = [[k, k] for k in obj["stale_k"]]
    return obj


def write(tmp_path: Path, obj, name: str = "table.json") -> Path:
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


def at_acceptance(controller: LookupController, acceptance: float) -> LookupController:
    """The controller with a fresh estimate of ``acceptance``."""
    controller.tracker.reset()
    controller.observe(1000, round(acceptance * 1000), k=1)  # at K=1 the rate is the estimate
    return controller


# ---------------------------------------------------------------------- the format


@pytest.mark.parametrize("make", [plain_json, context_json])
def test_round_trips_through_json_and_files(tmp_path, make):
    table = table_from_json(make())
    assert table.to_json() == make()
    table.save(tmp_path / "t.json")
    assert load_table(tmp_path / "t.json") == table
    assert json.loads((tmp_path / "t.json").read_text()) == make()


def test_table_copies_its_arguments():
    obj = plain_json()
    table = table_from_json(obj)
    obj["k"][0][0] = 4
    assert table.k[0][0] == 1


def _set(path, value):
    def mutate(obj):
        *parents, last = path
        node = obj
        for key in parents:
            node = node[key]
        node[last] = value

    return mutate


def _delete(key):
    return lambda obj: obj.pop(key)


def _context(mutate):
    def both(obj):
        obj.update(context_json())
        mutate(obj)

    return both


MALFORMED = [
    ("k_max is a string", _set(["k_max"], "4"), "'k_max'"),
    ("k_max is a bool", _set(["k_max"], True), "'k_max'"),
    ("k_max is a float", _set(["k_max"], 4.0), "'k_max'"),
    ("max_batch is a bool", _set(["max_batch"], True), "'max_batch'"),
    ("max_batch is huge", _set(["max_batch"], 10**12), "'max_batch'"),
    ("an edge is NaN", _set(["acceptance_edges", 1], math.nan), "'acceptance_edges'"),
    ("an edge is inf", _set(["acceptance_edges", 3], math.inf), "'acceptance_edges'"),
    ("edges go down", _set(["acceptance_edges"], [0, 0.8, 0.5, 1]), r"\[2\] = 0.5 follows 0.8"),
    ("edges miss 1", _set(["acceptance_edges"], [0, 0.5]), "'acceptance_edges'.*ends at 0.5"),
    (
        "edges repeat",
        _set(["acceptance_edges"], [0, 0.5, 0.5, 1]),
        r"strictly increasing edges .*; \[2\] = 0.5 follows 0.5",
    ),
    ("K above k_max", _set(["k", 0, 2], 5), r"'k'\[0\]\[2\]: K=5 is above k_max"),
    ("K negative", _set(["k", 1, 0], -1), r"'k'\[1\]\[0\]"),
    ("K is a bool", _set(["k", 1, 0], True), r"'k'\[1\]\[0\]"),
    ("K is NaN", _set(["k", 1, 0], math.nan), r"'k'\[1\]\[0\]"),
    ("K is a float", _set(["k", 1, 0], 1.0), r"'k'\[1\]\[0\]"),
    ("a row is short", _set(["k", 2], [0, 1]), r"'k'\[2\]"),
    ("a row is missing", _set(["k"], [[1, 3, 4], [0, 2, 3]]), "'k'"),
    ("gap in buckets", _set(["batch_buckets", 1], [6, 8]), r"'batch_buckets'\[1\].*gap"),
    ("overlap in buckets", _set(["batch_buckets", 1], [4, 8]), r"'batch_buckets'\[1\].*overlaps"),
    ("buckets start at 2", _set(["batch_buckets", 0], [2, 4]), "start at 1"),
    ("buckets shuffled", _set(["batch_buckets"], [[5, 8], [1, 4], [9, 16]]), "start at 1"),
    ("buckets stop short", _set(["max_batch"], 20), "must end at 20"),
    ("bucket reversed", _set(["batch_buckets", 0], [4, 1]), r"'batch_buckets'\[0\]"),
    ("bucket bound is a float", _set(["batch_buckets", 0], [1, 4.0]), r"'batch_buckets'\[0\]"),
    ("no stale entry", _delete("stale_k"), "missing field 'stale_k'.*unknown or stale"),
    ("stale entry short", _set(["stale_k"], [1, 0]), "'stale_k'"),
    ("stale K above k_max", _set(["stale_k", 0], 9), r"'stale_k'\[0\]"),
    ("no probe", _delete("probe"), "missing field 'probe'"),
    ("probe K is 0", _set(["probe", "k"], 0), "'probe'.k"),
    ("probe K above k_max", _set(["probe", "k"], 5), "'probe'.k"),
    ("probe after 0 steps", _set(["probe", "after_steps"], 0), "'probe'.after_steps"),
    ("probe has junk", _set(["probe", "every"], 3), "'probe'"),
    ("probe scope unknown", _set(["probe", "scope"], "sometimes"), "'probe'.scope"),
    ("probe scope not a string", _set(["probe", "scope"], ["all"]), "'probe'.scope"),
    ("operating probe, no acceptance", _set(["probe", "scope"], "operating"), "'probe'.acceptance"),
    (
        "operating probe, acceptance NaN",
        lambda o: o["probe"].update(scope="operating", acceptance=math.nan),
        "'probe'.acceptance",
    ),
    (
        "operating probe, acceptance above 1",
        lambda o: o["probe"].update(scope="operating", acceptance=1.5),
        "'probe'.acceptance",
    ),
    (
        "operating probe, acceptance a string",
        lambda o: o["probe"].update(scope="operating", acceptance="0.7"),
        "'probe'.acceptance",
    ),
    (
        "acceptance with scope all",
        lambda o: o["probe"].update(scope="all", acceptance=0.7),
        'only the scope "operating" takes',
    ),
    ("no provenance", _delete("provenance"), "missing field 'provenance'"),
    ("provenance lacks a key", lambda o: o["provenance"].pop("run_id"), "'run_id'"),
    ("training steps a string", _set(["provenance", "training_steps"], "1k"), "training_steps"),
    (
        "fingerprint holds a list",
        _set(["provenance", "profile_fingerprint", "x"], [1]),
        "profile_fingerprint.x",
    ),
    ("provenance holds NaN", _set(["provenance", "score"], math.nan), "provenance'.score"),
    ("unknown format", _set(["format"], "specrl-profile"), "'format'"),
    ("unknown version", _set(["version"], 3), "'version'"),
    ("version 1: accepted / drafted", _set(["version"], 1), "version 1 tables index"),
    ("version is a bool", _set(["version"], True), "'version'"),
    ("unknown field", _set(["contxt_bins"], []), "unknown field.*'contxt_bins'"),
    ("context not open-ended", _context(_set(["context_bins", 1, 1], 4096)), "open-ended"),
    ("context gap", _context(_set(["context_bins", 1, 0], 600)), "gap"),
    ("context from 0", _context(_set(["context_bins", 0, 0], 0)), "'context_bins'"),
    ("context K shape", _context(_set(["k", 0], [[1, 3, 4]])), r"'k'\[0\]"),
    ("context stale shape", _context(_set(["stale_k", 0], 1)), r"'stale_k'\[0\]"),
]


@pytest.mark.parametrize("mutate, match", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_tables_are_rejected_naming_the_field(tmp_path, mutate, match):
    obj = plain_json()
    mutate(obj)
    with pytest.raises(SpecrlError, match=match):
        load_table(write(tmp_path, obj))


@pytest.mark.parametrize(
    "text, match",
    [
        (json.dumps(plain_json())[:-40], "not valid JSON"),
        ("", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ("9" * 5000, "not valid JSON"),  # beyond json's integer digits
        ("[" * 100_000, "not valid JSON"),  # beyond json's nesting
        (json.dumps(plain_json()).replace('"k_max": 4', '"k_max": NaN'), "'k_max'"),
    ],
    ids=["truncated", "empty", "array", "huge integer", "deep nesting", "NaN literal"],
)
def test_unreadable_files_are_rejected(tmp_path, text, match):
    with pytest.raises(SpecrlError, match=match):
        load_table(write(tmp_path, text))


def test_missing_file_says_how_to_make_one(tmp_path):
    with pytest.raises(SpecrlError, match="not found; export the table"):
        load_table(tmp_path / "nope.json")


# ---------------------------------------------------------------------- fuzz

JUNK = [
    None,
    "x",
    True,
    False,
    0,
    -1,
    1.5,
    10**6,
    10**30,
    math.nan,
    math.inf,
    [],
    {},
    [[{"a": [1]}]],
]


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, (*prefix, i))


def _mutate(obj, rng: random.Random):
    """One random change somewhere in ``obj``; returns the new object (or JSON text)."""
    path = rng.choice([p for p in _paths(obj) if p])
    *parents, last = path
    parent = obj
    for key in parents:
        parent = parent[key]
    node = parent[last]
    kind = rng.randrange(8)
    if kind == 0:
        del parent[last]
    elif kind == 1:
        parent[last] = copy.deepcopy(rng.choice(JUNK))
    elif kind == 2 and isinstance(node, list):
        rng.shuffle(node)
    elif kind == 3 and isinstance(node, list) and node:
        node.append(copy.deepcopy(rng.choice(node)))
    elif kind == 4 and isinstance(node, int) and not isinstance(node, bool):
        parent[last] = node + rng.choice([-2, -1, 1, 2, 10**9])
    elif kind == 5:
        parent[last] = [node, copy.deepcopy(rng.choice(JUNK))]
    elif kind == 6:
        text = json.dumps(obj)
        return text[: rng.randrange(len(text))]
    else:  # a change that keeps the file valid as often as not
        if isinstance(node, int) and not isinstance(node, bool):
            parent[last] = rng.randrange(0, 5)
    return obj


def test_fuzzed_tables_load_and_behave_or_raise_specrl_error(tmp_path):
    rng = random.Random(20261102)
    outcomes = {"loaded": 0, "rejected": 0}
    for i in range(240):
        obj = plain_json() if i % 2 else context_json()
        for _ in range(rng.randint(1, 3)):
            obj = _mutate(obj, rng)
            if isinstance(obj, str):
                break
        path = write(tmp_path, obj if isinstance(obj, str) else json.dumps(obj), f"{i}.json")
        try:
            controller = LookupController.load(path)
        except SpecrlError:
            outcomes["rejected"] += 1
            continue
        outcomes["loaded"] += 1
        table = controller.table
        for step in range(3):
            for batch in range(table.max_batch + 6):
                for context in (None, 0, 1, 600, 10**7):
                    k = controller.choose_k(batch, 0.01, context)
                    assert type(k) is int and 0 <= k <= table.k_max, (path.read_text(), batch)
            controller.observe(*[(0, 0), (8, 5), (4, 4)][step])
    assert outcomes["loaded"] >= 20 and outcomes["rejected"] >= 100, outcomes


# ---------------------------------------------------------------------- the controller


def test_controller_looks_up_batch_and_acceptance_and_clamps_the_batch():
    controller = LookupController(table_from_json(plain_json()))
    expected = {0.3: (1, 0, 0), 0.6: (3, 2, 0), 0.9: (4, 3, 1)}
    for acceptance, (small, middle, large) in expected.items():
        at_acceptance(controller, acceptance)
        assert [controller.choose_k(b) for b in (1, 4, 5, 8, 9, 16)] == [
            small,
            small,
            middle,
            middle,
            large,
            large,
        ]
        assert controller.choose_k(17) == controller.choose_k(10_000) == large  # clamped
        assert controller.choose_k(0) == controller.choose_k(-3) == 0  # nothing to decode
    assert controller.choose_k(2, step_time_s=5.0) == 4  # step time is not indexed


def test_acceptance_on_an_edge_takes_the_upper_bin():
    controller = at_acceptance(LookupController(table_from_json(plain_json())), 0.5)
    assert controller.choose_k(1) == 3
    assert at_acceptance(controller, 1.0).choose_k(1) == 4


def test_context_bins_pick_the_longest_row():
    controller = at_acceptance(LookupController(table_from_json(context_json())), 0.6)
    assert [controller.choose_k(6, context_len=c) for c in (None, 0, 1, 511)] == [2, 2, 2, 2]
    assert [controller.choose_k(6, context_len=c) for c in (512, 10**9)] == [3, 3]


def test_controller_estimate_matches_the_feature_module():
    controller = LookupController(table_from_json(plain_json()))
    tracker = AcceptanceTracker()
    for drafted, accepted, k in [(8, 6, 2), (0, 0, 0), (16, 4, 4), (4, 4, 1), (0, 0, 0)]:
        controller.observe(drafted, accepted, k)
        tracker.observe(drafted, accepted, k)
        assert (controller.tracker.estimate, controller.tracker.staleness) == (
            tracker.estimate,
            tracker.staleness,
        )


def test_controller_reads_a_step_at_the_k_it_chose():
    """Without ``k``, ``observe`` reads the step at the K ``choose_k`` returned last: the same
    6 of 8 accepted is a per-token 0.75 at K=1 and ``(sqrt(7) - 1) / 2`` at K=2
    (``a + a^2 = 1.5``)."""
    controller = at_acceptance(LookupController(table_from_json(plain_json())), 0.9)
    assert controller.choose_k(9) == 1
    controller.tracker.reset()
    controller.observe(8, 6)
    assert controller.tracker.estimate == 0.75
    assert controller.choose_k(5) == 2
    controller.tracker.reset()
    controller.observe(8, 6)
    assert controller.tracker.estimate == pytest.approx((math.sqrt(7) - 1) / 2)
    controller.tracker.reset()
    controller.observe(8, 6, k=1)  # told: the engine ran another K
    assert controller.tracker.estimate == 0.75


def test_stale_estimate_uses_the_stale_entry():
    controller = LookupController(table_from_json(plain_json()))
    assert controller.choose_k(2) == 1  # nothing measured yet: stale_k of batch 1-4
    at_acceptance(controller, 0.9)
    for _ in range(STALE_STEPS - 1):
        controller.observe(0, 0)
    assert controller.choose_k(2) == 4  # 31 steps without drafting: still fresh
    controller.observe(0, 0)
    assert controller.choose_k(2) == 1  # 32: fully stale, as the observation's staleness


def test_k0_table_probes_then_measures_again():
    obj = plain_json()
    obj["k"] = [[0, 0, 0]] * 3
    obj["stale_k"] = [0, 0, 0]
    obj["probe"] = {"after_steps": 8, "k": 2}
    controller = LookupController(table_from_json(obj))
    assert controller.choose_k(10) == 2  # nothing measured: probe at once
    controller.observe(20, 15)  # the probe drafted 2 tokens on 10 rows
    # accepted / drafted 0.75 at K=2: per token a + a^2 = 1.5
    first = (math.sqrt(7) - 1) / 2
    assert controller.tracker.estimate == pytest.approx(first)
    assert controller.tracker.since_measured == 0
    ks = []
    for _ in range(20):
        k = controller.choose_k(10)
        ks.append(k)
        controller.observe(10 * k, 5 * k)
    assert ks == ([0] * 8 + [2]) * 2 + [0, 0]  # one probe after every 8 steps at K=0
    half = (math.sqrt(5) - 1) / 2  # a + a^2 = 1: 0.5 accepted / drafted at K=2
    assert controller.tracker.estimate == pytest.approx(half + (first - half) * 0.75**2)
    for _ in range(6):
        controller.observe(0, 0)
    assert controller.choose_k(10) == 2
    controller.observe(0, 0)  # the engine drafted nothing after all: probe again
    assert controller.choose_k(10) == 2


def test_long_probe_interval_still_probes_on_the_first_step():
    """Nothing measured yet counts as past any probe interval: a table that says K=0 when
    stale does not run 256 blind steps at the start, then waits the full interval."""
    obj = plain_json()
    obj["stale_k"] = [0, 0, 0]
    obj["probe"] = {"after_steps": 256, "k": 1}
    controller = LookupController(table_from_json(obj))
    assert controller.tracker.since_measured == NEVER_MEASURED
    assert controller.choose_k(12) == 1  # stale_k is 0 at 9-16 rows: the probe instead
    controller.observe(12, 0)  # measured: acceptance 0, K=0 at 9-16 rows
    ks = [controller.choose_k(12)]
    while ks[-1] == 0:
        controller.observe(0, 0)
        ks.append(controller.choose_k(12))
    assert ks == [0] * 256 + [1]  # then the interval runs in full
    controller.reset()
    assert controller.choose_k(12) == 1  # a reset forgets what was measured: probe again


def test_default_probe_fires_when_the_estimate_goes_stale():
    controller = at_acceptance(LookupController(table_from_json(plain_json())), 0.3)
    ks = []
    for _ in range(STALE_STEPS + 1):
        ks.append(controller.choose_k(16))
        controller.observe(0, 0)
    assert ks == [0] * STALE_STEPS + [1]


# ---------------------------------------------------------------------- provenance


def test_provenance_refuses_other_hardware_or_pair_unless_forced(tmp_path):
    path = write(tmp_path, plain_json())
    LookupController.load(path, profile=dict(FINGERPRINT, torch="other"))
    LookupController.load(path, profile=SimpleNamespace(fingerprint=FINGERPRINT))
    for key in HARD_FINGERPRINT_KEYS:
        other = dict(FINGERPRINT, **{key: "else"})
        with pytest.raises(SpecrlError, match=f"other hardware or another model pair.*{key}"):
            LookupController.load(path, profile=other)
        with pytest.warns(UserWarning, match=key):
            controller = LookupController.load(path, profile=other, force=True)
        assert controller.choose_k(1) == 1
    with pytest.raises(SpecrlError, match="Profile, its fingerprint dict or its file's path, got"):
        LookupController.load(path, profile=5)
    with pytest.raises(SpecrlError, match="profile file cpu not found; measure one"):
        LookupController.load(path, profile="cpu")
    # A profile file's path: only its fingerprint is read.
    (tmp_path / "p.json").write_text(json.dumps({"fingerprint": FINGERPRINT}))
    assert LookupController.load(path, profile=tmp_path / "p.json").choose_k(1) == 1
    (tmp_path / "q.json").write_text(json.dumps({"fingerprint": dict(FINGERPRINT, device="x")}))
    with pytest.raises(SpecrlError, match=r"another model pair.*or force it \(--force, force="):
        LookupController.load(path, profile=str(tmp_path / "q.json"))
    with pytest.warns(UserWarning, match=r"device.*using it anyway \(forced\)$"):
        LookupController.load(path, profile=str(tmp_path / "q.json"), force=True)
    (tmp_path / "r.json").write_text("[]")
    with pytest.raises(SpecrlError, match="r.json has no 'fingerprint' object"):
        LookupController.load(path, profile=tmp_path / "r.json")


def test_controller_refuses_impossible_steps_and_batch_sizes(tmp_path):
    controller = LookupController.load(write(tmp_path, plain_json()))
    for drafted, accepted in ((5, 9), (4, -1), (-2, -3), (None, 0), (2.5, 1), (4, 1.0)):
        with pytest.raises(SpecrlError, match=f"accepted={accepted} and drafted={drafted}"):
            controller.observe(drafted, accepted)
    for k in (9, -1, 2.0, "1"):
        with pytest.raises(SpecrlError, match=rf"observe: k={k!r}; .*integer in 0\.\.4"):
            controller.observe(4, 2, k=k)
    for batch in (2.5, "8", None, 1000.5, float("nan"), float("inf")):
        with pytest.raises(SpecrlError, match="batch_size must be an integer.*got"):
            controller.choose_k(batch)
    import numpy as np  # a serving stack may pass numpy integers

    assert controller.choose_k(np.int64(3)) == controller.choose_k(3)
    controller.observe(np.int64(8), np.int32(6), k=np.int64(2))


def test_hard_keys_are_the_profiles():
    """Read without importing specrl.profile.fingerprint, which imports torch."""
    source = Path(specrl.controller.__file__).parent / "profile" / "fingerprint.py"
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "HARD_KEYS":
            assert ast.literal_eval(node.value) == HARD_FINGERPRINT_KEYS
            return
    pytest.fail("HARD_KEYS not found")


def test_controller_and_export_import_no_numpy_torch_gymnasium_or_sb3(tmp_path):
    """In a fresh interpreter with those blocked, without ``specrl/__init__.py`` (which
    registers the Gymnasium envs): the modules a serving stack vendors."""
    package = Path(specrl.controller.__file__).parent
    path = write(tmp_path, context_json())
    code = (
        "import sys, types\n"
        "for name in ('numpy', 'torch', 'gymnasium', 'stable_baselines3'):\n"
        "    sys.modules[name] = None\n"
        "package = types.ModuleType('specrl')\n"
        f"package.__path__ = [{str(package)!r}]\n"
        "sys.modules['specrl'] = package\n"
        "from specrl.controller import LookupController\n"
        "import specrl.table.build\n"
        "import specrl.table.stacks\n"
        f"controller = LookupController.load({str(path)!r})\n"
        "controller.observe(10, 9)\n"
        "print(controller.choose_k(3, context_len=600))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "4"


def test_importing_the_package_loads_no_gymnasium_and_registers_the_envs_when_it_loads():
    """Through the real package: ``import specrl.controller`` loads neither gymnasium, numpy
    nor torch; importing gymnasium afterwards registers specrl's envs (and before, at once)."""
    code = (
        "import sys\n"
        "import specrl.controller\n"
        "print(sorted(m for m in ('gymnasium', 'numpy', 'torch') if m in sys.modules))\n"
        "import gymnasium\n"
        "print(sorted(i for i in gymnasium.registry if i.startswith('specrl/')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.strip().splitlines()
    assert first == "[]"
    assert second == "['specrl/LiveSpec-v0', 'specrl/SurrogateSpec-v0']"
    before = "import gymnasium, specrl; print('specrl/SurrogateSpec-v0' in gymnasium.registry)"
    out = subprocess.run([sys.executable, "-c", before], capture_output=True, text=True)
    assert out.stdout.strip() == "True", out.stderr


# ---------------------------------------------------------------------- exports


def test_vllm_export_merges_equal_ranges():
    table = table_from_json(plain_json())
    assert to_vllm(table, acceptance=0.9) == {
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 8, 3], [9, 16, 1]],
    }
    assert to_vllm(table, acceptance=0.3)["num_speculative_tokens_per_batch_size"] == [
        [1, 4, 1],
        [5, 16, 0],
    ]


def test_trtllm_export_uses_upper_bounds():
    table = table_from_json(plain_json())
    assert to_trtllm(table, acceptance=0.9) == {
        "max_draft_len": 4,
        "draft_len_schedule": {4: 4, 8: 3, 16: 1},
    }
    # Above the last key TensorRT-LLM drafts nothing: the trailing K=0 range is left out.
    assert to_trtllm(table, acceptance=0.3) == {"max_draft_len": 1, "draft_len_schedule": {4: 1}}


@pytest.mark.parametrize("acceptance", [0.0, 0.3, 0.5, 0.6, 0.9, 1.0])
@pytest.mark.parametrize("make", [plain_json, context_json])
def test_exports_round_trip_through_batch_schedule(make, acceptance):
    from specrl.policies import BatchSchedule

    table = table_from_json(make())
    controller = at_acceptance(LookupController(table), acceptance)
    vllm = BatchSchedule.from_vllm(
        to_vllm(table, acceptance=acceptance), max_batch=40, max_len=4096
    )
    trtllm = BatchSchedule.from_trtllm(to_trtllm(table, acceptance=acceptance), max_batch=40)
    for batch in range(1, table.max_batch + 1):
        for context in (1, 511, 512, 10**6):
            k = controller.choose_k(batch, context_len=context)
            assert vllm.k_for(batch, context) == k, (batch, context)
        assert trtllm.k_for(batch) == controller.choose_k(batch), batch
    for batch in range(table.max_batch + 1, 41):  # vLLM extends the last range
        assert vllm.k_for(batch) == controller.choose_k(batch)


def test_vllm_export_with_context_bins_is_a_rectangular_grid():
    entries = to_vllm(table_from_json(context_json()), acceptance=0.9)[
        "num_speculative_tokens_per_batch_size"
    ]
    assert entries == [
        [1, 4, 1, 511, 4],
        [1, 4, 512, 2**31 - 1, 4],
        [5, 8, 1, 511, 3],
        [5, 8, 512, 2**31 - 1, 4],
        [9, 16, 1, 511, 1],
        [9, 16, 512, 2**31 - 1, 2],
    ]


def test_trtllm_clamps_k_rising_above_batch_1_and_refuses_k0_at_batch_1():
    from specrl.policies import BatchSchedule

    obj = plain_json()
    obj["k"] = [[2, 2, 2], [3, 3, 3], [1, 1, 1]]
    table = table_from_json(obj)
    with pytest.warns(UserWarning, match="clamped batch 5-8: K=3 to 2"):
        config = to_trtllm(table, acceptance=0.5)
    assert config == {"max_draft_len": 2, "draft_len_schedule": {8: 2, 16: 1}}
    schedule = BatchSchedule.from_trtllm(config, max_batch=16)
    assert [schedule.k_for(b) for b in (1, 8, 9, 16)] == [2, 2, 1, 1]

    obj["k"] = [[0, 0, 0], [3, 3, 3], [1, 1, 1]]
    with pytest.raises(SpecrlError, match="drafts nothing at batch 1.*--format vllm"):
        to_trtllm(table_from_json(obj), acceptance=0.5)
    obj["k"] = [[0, 0, 0]] * 3
    with pytest.raises(SpecrlError, match="drafts nothing at any batch size at acceptance 0.5"):
        to_trtllm(table_from_json(obj), acceptance=0.5)
    with pytest.warns(UserWarning, match="vLLM would load the draft model and never use it"):
        config = to_vllm(table_from_json(obj), acceptance=0.5)
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 16, 0]]


def test_cli_prints_specrl_warnings_plainly_and_others_as_python_does(capsys, recwarn):
    import warnings

    from specrl.cli import _plain_warnings
    from specrl.errors import SpecrlWarning

    with _plain_warnings():
        warnings.simplefilter("always")
        warnings.warn("ours", SpecrlWarning, stacklevel=1)
        warnings.warn("theirs", UserWarning, stacklevel=1)
    # Ours is printed as a line; theirs goes on to Python's own handler (here pytest's).
    assert capsys.readouterr().err == "specrl: warning: ours\n"
    assert [(w.category, str(w.message)) for w in recwarn] == [(UserWarning, "theirs")]


def test_export_cli_prints_the_clamp_as_a_plain_warning(tmp_path, capsys):
    from specrl.cli import main

    obj = plain_json()
    obj["k"] = [[2, 2, 2], [3, 3, 3], [1, 1, 1]]
    native, out = write(tmp_path, obj), tmp_path / "trt.json"
    args = ["export", "--table", str(native), "--format", "trtllm", "--acceptance", "0.5"]
    assert main([*args, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    warning = "specrl: warning: TensorRT-LLM cannot draft more than at batch 1 (max_draft_len=2)"
    assert warning + "; clamped batch 5-8: K=3 to 2\n" in err
    assert "UserWarning" not in err and "warnings.warn" not in err
    assert json.loads(out.read_text())["speculative_config"]["draft_len_schedule"] == {
        "8": 2,
        "16": 1,
    }


def test_export_of_a_table_refuses_the_options_that_act_on_a_run(tmp_path, capsys):
    from specrl.cli import main

    native, out = write(tmp_path, plain_json()), tmp_path / "out.json"
    args = ["export", "--table", str(native), "--out", str(out)]
    assert main([*args, "--probe-scope", "all", "--monotone", "--episodes", "1"]) == 2
    assert capsys.readouterr().err == (
        "specrl: error: --episodes, --monotone, --probe-scope: these act on tabulating a run, "
        "and --table only converts a table already written; pass them with --run RUN_DIR "
        "instead\n"
    )
    assert main([*args, "--force"]) == 2
    assert "--force: this acts on tabulating a run" in capsys.readouterr().err
    assert not out.exists()
    assert main(args) == 0 and json.loads(out.read_text()) == plain_json()


@pytest.mark.parametrize("fmt", ["vllm", "trtllm", "sglang"])
def test_export_files_read_back_and_say_the_operating_point(tmp_path, fmt):
    from specrl.policies import BatchSchedule

    table = table_from_json(plain_json())
    obj = export_file(table, fmt=fmt, acceptance=0.9)
    assert obj["specrl"]["acceptance"] == 0.9 and obj["specrl"]["format"] == fmt
    path = write(tmp_path, obj)
    schedule = BatchSchedule.from_file(path, max_batch=16)
    assert [schedule.k_for(b) for b in (1, 5, 9)] == [4, 3, 1]
    assert export_file(table, fmt="native") == table.to_json()
    with pytest.raises(SpecrlError, match="--acceptance"):
        export_file(table, fmt=fmt)
    with pytest.raises(SpecrlError, match="acceptance must be"):
        export_file(table, fmt=fmt, acceptance=math.nan)


# ---------------------------------------------------------------------- table_from_policy


def test_table_from_policy_evaluates_midpoints_and_merges_batches():
    calls = []

    def decide(batch, acceptance, context):
        calls.append((batch, acceptance, context))
        return (4 if acceptance > 0.5 else 1) if batch <= 3 else (2 if batch <= 10 else 0)

    table = table_from_policy(
        decide, k_max=4, max_batch=12, acceptance_edges=[0, 0.5, 1], provenance=PROVENANCE
    )
    assert {a for _, a, _ in calls} == {0.25, 0.75} and {c for *_, c in calls} == {1}
    assert table.batch_buckets == [[1, 3], [4, 10], [11, 12]]
    assert table.k == [[1, 4], [2, 2], [0, 0]]
    assert table.stale_k == [1, 2, 0]  # the lowest acceptance bin's K
    assert table.probe == {"after_steps": STALE_STEPS, "k": 1}


def test_table_from_policy_with_context_bins_and_stale_rule():
    contexts = set()

    def decide(batch, acceptance, context):
        contexts.add(context)
        return 3 if context > 1000 else 1

    table = table_from_policy(
        decide,
        k_max=4,
        max_batch=4,
        acceptance_edges=(0, 1),
        context_bins=[(1, 1000), [1001, None]],
        stale_decide=lambda batch, context: 0,
        probe={"after_steps": 4, "k": 2},
        provenance=PROVENANCE,
    )
    assert contexts == {500, 1001}
    assert table.batch_buckets == [[1, 4]]
    assert table.k == [[[1], [3]]] and table.stale_k == [[0, 0]]
    assert table_from_json(table.to_json()) == table


def _monotone_sequences(n: int, k_max: int):
    if n == 0:
        yield []
        return
    for rest in _monotone_sequences(n - 1, k_max):
        for k in range(rest[-1] if rest else 0, k_max + 1):
            yield [*rest, k]


def test_monotone_in_acceptance_is_the_closest_non_decreasing_sequence():
    # Against every non-decreasing sequence, enumerated: the result is one of the closest
    # (sum of |K - K'|), and lies at or below every other closest one.
    rng = random.Random(7)
    for trial in range(400):
        k_max = rng.randint(1, 3)
        ks = [rng.randint(0, k_max) for _ in range(rng.randint(0, 6))]
        weights = [rng.choice([1e-3, 1, 2, 7]) for _ in ks] if trial % 2 else None
        got = monotone_in_acceptance(ks, k_max, weights)
        w = weights or [1] * len(ks)
        costs = {
            tuple(m): sum(c * abs(x - y) for c, x, y in zip(w, m, ks))
            for m in _monotone_sequences(len(ks), k_max)
        }
        best = min(costs.values())
        assert costs[tuple(got)] == pytest.approx(best), (ks, weights, got)
        for m, cost in costs.items():
            if cost == pytest.approx(best):
                assert all(g <= x for g, x in zip(got, m)), (ks, weights, got, m)
        if ks == sorted(ks):
            assert got == ks
    # A K=1 band at middling acceptance with off above it (as a learned policy extrapolates
    # at estimates it rarely met) is raised; a narrow K=1 blip below an off band is lowered.
    assert monotone_in_acceptance([0] * 6 + [1] * 3 + [0] * 2, 4) == [0] * 6 + [1] * 5
    assert monotone_in_acceptance([0, 0, 1, 0, 0, 0, 1, 1, 2, 2], 4) == [0] * 6 + [1, 1, 2, 2]
    # Weighted by visits: a K=2 band the policy acts in often is kept and the rarely met K=1
    # above it raised, where unweighted the (as wide) band would be lowered instead.
    band = [0, 2, 2, 1, 1]
    assert monotone_in_acceptance(band, 4) == [0, 1, 1, 1, 1]
    assert monotone_in_acceptance(band, 4, [1, 50, 50, 1e-3, 1e-3]) == [0, 2, 2, 2, 2]
    for bad in ([1, 1], [1, 1, 0, 1, 1], [1, 1, -1, 1, 1]):
        with pytest.raises(SpecrlError, match="weights must be 5 positive numbers"):
            monotone_in_acceptance(band, 4, bad)


def test_table_from_policy_monotone_counts_the_cells_it_changed():
    def decide(batch, acceptance, context):  # off, K=1 in a band, off again above 0.8
        return 1 if batch > 2 and 0.5 < acceptance < 0.8 else (2 if batch <= 2 else 0)

    edges = [i / 10 for i in range(11)]
    raw = table_from_policy(
        decide, k_max=4, max_batch=4, acceptance_edges=edges, provenance=PROVENANCE
    )
    assert raw.k[1] == [0] * 5 + [1] * 3 + [0] * 2 and "monotone_cells_changed" not in (
        raw.provenance
    )
    table = table_from_policy(
        decide,
        k_max=4,
        max_batch=4,
        acceptance_edges=edges,
        provenance=PROVENANCE,
        monotone=True,
    )
    assert table.batch_buckets == [[1, 2], [3, 4]]
    assert table.k == [[2] * 10, [0] * 5 + [1] * 5]
    assert table.provenance["monotone_cells_changed"] == 2 * 2  # 2 batch sizes, 2 bins each
    assert table_from_json(table.to_json()) == table


@pytest.mark.parametrize(
    "decide, match",
    [
        (lambda b, a, c: 5, "K=5, not in 0..4"),
        (lambda b, a, c: -1, "not in 0..4"),
        (lambda b, a, c: "2", "not an integer"),
        (lambda b, a, c: True, "not in 0..4"),
        (lambda b, a, c: 1.0, "not an integer"),
    ],
)
def test_table_from_policy_rejects_bad_decisions(decide, match):
    with pytest.raises(SpecrlError, match=match):
        table_from_policy(
            decide, k_max=4, max_batch=4, acceptance_edges=[0, 1], provenance=PROVENANCE
        )


def test_table_from_policy_rejects_bad_settings():
    ok = {"k_max": 4, "max_batch": 4, "acceptance_edges": [0, 1], "provenance": PROVENANCE}
    for change, match in [
        ({"max_batch": 0}, "max_batch"),
        ({"k_max": True}, "k_max"),
        ({"acceptance_edges": [0.5, 1]}, "acceptance_edges"),
        ({"context_bins": [[1, 10]]}, "open-ended"),
        ({"provenance": {}}, "provenance"),
        ({"probe": {"after_steps": 1}}, "probe"),
    ]:
        with pytest.raises(SpecrlError, match=match):
            table_from_policy(lambda b, a, c: 1, **{**ok, **change})


def test_ktable_constructor_validates():
    with pytest.raises(SpecrlError, match="KTable: field 'stale_k'"):
        KTable(**{**table_from_json(plain_json()).__dict__, "stale_k": [1]})


# ---------------------------------------------------------------------- benchmark


def test_bench_controller_smoke(tmp_path, capsys):
    from specrl.bench.controller import bench_controller
    from specrl.cli import main

    assert bench_controller(calls=10_000) > 0
    path = write(tmp_path, context_json())
    assert bench_controller(path, calls=1000) > 0
    assert main(["bench", "controller", "--table", str(path), "--calls", "2000"]) == 0
    assert "ns per call" in capsys.readouterr().out


def test_speculating_probe_scope_probes_only_where_the_table_can_draft():
    """Scope "speculating": no probe at 9-16 rows, whose row is K=0 at every estimate (a probe
    there could not change the K and would pay the draft's catch-up); at 1-4 rows, which
    draft at some estimate, the interval counts as usual. Scope "all" (the default) probes
    at 9-16 rows too."""
    obj = plain_json()
    obj["k"] = [[0, 0, 2], [0, 0, 0], [0, 0, 0]]
    obj["stale_k"] = [0, 0, 0]
    obj["probe"] = {"after_steps": 8, "k": 1, "scope": "speculating"}
    speculating = LookupController(table_from_json(obj))
    del obj["probe"]["scope"]
    every = LookupController(table_from_json(obj))
    assert "scope" not in every.table.to_json()["probe"]  # absent: probes everywhere
    for controller in (speculating, every):
        controller.observe(10, 0)  # measured: acceptance 0
    ks = {"speculating": [], "all": []}
    for name, controller in (("speculating", speculating), ("all", every)):
        for batch in [12] * 20 + [3] * 2:
            k = controller.choose_k(batch)
            ks[name].append(k)
            controller.observe(batch * k, 0)
    assert ks["speculating"] == [0] * 20 + [1, 0]  # 20 steps past 8 at 12 rows: no probe
    assert ks["all"] == ([0] * 8 + [1]) * 2 + [0, 0, 0] + [0]  # probes at 12 rows
    fresh = LookupController(
        table_from_json({**obj, "probe": {"after_steps": 8, "k": 1, "scope": "speculating"}})
    )
    assert fresh.choose_k(12) == 0  # nothing measured, but nothing to measure for at 12 rows
    assert fresh.choose_k(2) == 1  # at 2 rows the table can draft: probe at once


def test_operating_probe_scope_probes_where_the_table_drafts_at_typical_acceptance():
    """Scope "operating" at acceptance 0.6: 1-4 rows draft from the first bin, 5-8 rows from
    [0.5, 0.8) (holding 0.6), so both probe; 9-16 rows draft only from 0.8, above it, so no
    probe there, although "speculating" probes there. A fresh estimate of 0.9 still drafts
    at 9-16 rows: only the probe is scoped."""
    obj = plain_json()
    obj["k"] = [[1, 3, 4], [0, 2, 3], [0, 0, 1]]
    obj["stale_k"] = [0, 0, 0]
    obj["probe"] = {"after_steps": 8, "k": 1, "scope": "operating", "acceptance": 0.6}
    operating = table_from_json(obj)
    speculating = table_from_json(
        {**obj, "probe": {"after_steps": 8, "k": 1, "scope": "speculating"}}
    )
    assert [operating.probes_at(b) for b in range(3)] == [True, True, False]
    assert [speculating.probes_at(b) for b in range(3)] == [True, True, True]
    at_top = table_from_json({**obj, "probe": {**obj["probe"], "acceptance": 0.8}})
    assert [at_top.probes_at(b) for b in range(3)] == [True, True, True]  # 0.8 is in the top bin
    ks = {}
    for name, table in (("operating", operating), ("speculating", speculating)):
        controller = LookupController(table)
        controller.observe(10, 0)  # measured: acceptance 0
        ks[name] = []
        for batch in [12] * 10 + [6] * 2:
            k = controller.choose_k(batch)
            ks[name].append(k)
            controller.observe(batch * k, 0)
    assert ks["operating"] == [0] * 10 + [1, 0]  # past 8 steps: no probe at 12, at 6 at once
    assert ks["speculating"] == [0] * 8 + [1, 0, 0, 0]  # probes at 12 rows
    fresh = LookupController(operating)
    assert fresh.choose_k(12) == 0  # nothing measured, no probe at 12 rows
    fresh.observe(20, 18, k=2)  # a fresh estimate of 0.9 (per token, at K=2)
    assert fresh.tracker.estimate > 0.8 and fresh.choose_k(12) == 1


def test_operating_probe_scope_at_the_ends_and_with_context_bins():
    """At acceptance 0 only the first bin counts; at 1 every bin does (as "speculating"). With
    context bins each (bucket, context) cell is judged on its own Ks."""
    obj = plain_json()
    obj["k"] = [[1, 3, 4], [0, 2, 3], [0, 0, 1]]
    rule = {"after_steps": 8, "k": 1, "scope": "operating"}
    at = lambda a: table_from_json({**obj, "probe": {**rule, "acceptance": a}})  # noqa: E731
    assert [at(0).probes_at(b) for b in range(3)] == [True, False, False]
    assert [at(1).probes_at(b) for b in range(3)] == [True, True, True]
    obj = context_json()  # long contexts draft one more: 9-16 rows draft from 0.5 there
    table = table_from_json({**obj, "probe": {**rule, "acceptance": 0.6}})
    assert [[table.probes_at(b, c) for c in range(2)] for b in range(3)] == [
        [True, True],
        [True, True],
        [False, True],
    ]
    controller = LookupController(table)
    controller.observe(10, 0)  # measured: acceptance 0
    ks = []
    for _ in range(12):
        ks.append(controller.choose_k(12, context_len=100))
        controller.observe(0, 0)
    assert ks == [0] * 12  # short contexts at 9-16 rows: off, and past 8 steps no probe
    assert controller.choose_k(12, context_len=600) == 1  # long: the probe fires


# ---------------------------------------------------------------------- mutation gaps


def test_trtllm_export_takes_the_context_bin_holding_context_len():
    """``context_len`` picks the bin whose range holds it (512 opens the second bin of
    ``context_json``); None and lengths below 1 take the first. The export file says which."""
    table = table_from_json(context_json())
    short = {"max_draft_len": 4, "draft_len_schedule": {4: 4, 8: 3, 16: 1}}
    long = {"max_draft_len": 4, "draft_len_schedule": {8: 4, 16: 2}}
    for context_len, expected in [(None, short), (0, short), (511, short), (512, long)]:
        assert to_trtllm(table, acceptance=0.9, context_len=context_len) == expected, context_len
    assert to_trtllm(table, acceptance=0.9, context_len=10**6) == long
    obj = export_file(table, fmt="trtllm", acceptance=0.9, context_len=512)
    assert obj["speculative_config"] == long
    assert obj["specrl"]["context_len"] == 512 and obj["specrl"]["format"] == "trtllm"


def test_table_from_policy_keeps_batches_apart_whose_stale_k_differs():
    table = table_from_policy(
        lambda batch, acceptance, context: 2,
        k_max=4,
        max_batch=4,
        acceptance_edges=[0, 1],
        stale_decide=lambda batch, context: 0 if batch <= 2 else 1,
        provenance=PROVENANCE,
    )
    assert table.batch_buckets == [[1, 2], [3, 4]]
    assert table.k == [[2], [2]] and table.stale_k == [0, 1]


def test_exports_warn_only_when_they_drop_or_clamp_speculation():
    """No warning for vLLM when some batch sizes still draft, nor for TensorRT-LLM when a
    later range drafts as much as batch 1 (only more is clamped)."""
    import warnings

    obj = plain_json()
    obj["k"] = [[2, 2, 2], [1, 1, 1], [2, 2, 2]]
    table = table_from_json(obj)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert to_trtllm(table, acceptance=0.5) == {
            "max_draft_len": 2,
            "draft_len_schedule": {4: 2, 8: 1, 16: 2},
        }
        vllm = to_vllm(table_from_json(plain_json()), acceptance=0.3)
    assert vllm["num_speculative_tokens_per_batch_size"] == [[1, 4, 1], [5, 16, 0]]


def test_controller_clamps_a_batch_above_max_batch_to_the_last_bucket_of_one_size():
    obj = plain_json()
    obj["batch_buckets"] = [[1, 4], [5, 15], [16, 16]]
    controller = at_acceptance(LookupController(table_from_json(obj)), 0.9)
    assert [controller.choose_k(b) for b in (15, 16, 17, 1000)] == [3, 1, 1, 1]
