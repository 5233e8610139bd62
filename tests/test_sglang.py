"""SGLang's adaptive speculative config with one candidate per key: the export
(:func:`specrl.table.sglang.to_sglang`) and the reader (``BatchSchedule.from_sglang``).

SGLang pads the running batch size up to a CUDA-graph capture size (the smallest >= the
batch; a batch above the largest is not padded) and takes the entry of the largest key <=
the padded size. The expected arrays below are worked out by hand from that rule.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import warnings

import pytest
from test_table import JUNK, _mutate, at_acceptance, context_json, plain_json, write

from specrl.controller import LookupController
from specrl.errors import SpecrlError, SpecrlWarning
from specrl.policies import BatchSchedule
from specrl.table import table_from_json
from specrl.table.sglang import SGLANG_CUDA_GRAPH_BS, to_sglang
from specrl.table.stacks import FORMATS, export_file
from specrl.table.trtllm import to_trtllm
from specrl.table.vllm import to_vllm


def config(**ks: int) -> dict:
    """``config(_1=4, _9=2)`` -> ``{"1": {"candidate_steps": [4]}, "9": ...}``."""
    return {key.lstrip("_"): {"candidate_steps": [k]} for key, k in ks.items()}


def dense(schedule: BatchSchedule) -> list[int]:
    """K at batch 1..max_batch."""
    return [schedule.k_for(b) for b in range(1, schedule.max_batch + 1)]


@contextlib.contextmanager
def strict():
    """Any warning fails the block."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# ---------------------------------------------------------------------- semantics by hand


def test_default_capture_sizes():
    assert SGLANG_CUDA_GRAPH_BS == (
        *(1, 2, 3, 4, 5, 6, 7, 8),
        *(10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32),
        *(40, 48, 56),
        *(64, 80, 96, 112, 128, 144, 160),
    )
    assert "sglang" in FORMATS


def test_lower_bounds_at_the_padded_batch_size():
    """Batch 1-8 run at their own size: key 1. 9 pads to 10: largest key <= 10 is 9. 33
    pads to 40: key 33."""
    schedule = BatchSchedule.from_sglang(config(_1=4, _9=2, _33=0), max_batch=42)
    # fmt: off
    assert dense(schedule) == [
        4, 4, 4, 4, 4, 4, 4, 4,                          # 1-8
        2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,              # 9-20
        2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,              # 21-32
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0,                    # 33-42
    ]
    # fmt: on


def test_a_key_inside_a_padding_group_reaches_the_batch_sizes_below_it():
    """Default sizes (.., 8, 10, 12, .., 32, 40, 48, 56, 64, 80, 96, 112, ..., 160):

    * key 11: batch 10 pads to 10, below 11 (key 1); 11 pads to 12 (key 11).
    * key 12: batch 11 pads to 12, so 11 already takes key 12's K.
    * key 41: 33-40 pad to 40 (key 12); 41-48 pad to 48 (key 41).
    * key 100: 97-112 pad to 112, so 97-99 take key 100's K; above 160 nothing is padded.
    """
    schedule = BatchSchedule.from_sglang(config(_1=4, _11=2), max_batch=14)
    assert dense(schedule) == [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2, 2, 2, 2]

    schedule = BatchSchedule.from_sglang(config(_1=4, _12=2, _41=1, _100=3), max_batch=170)
    expected = [4] * 10 + [2] * 30 + [1] * 56 + [3] * 74  # 1-10, 11-40, 41-96, 97-170
    assert dense(schedule) == expected
    assert [schedule.k_for(b) for b in (10, 11, 40, 41, 96, 97, 99, 100)] == [
        4,
        2,
        2,
        1,
        1,
        3,
        3,
        3,
    ]


def test_the_deployments_capture_sizes_and_no_padding_above_the_largest():
    """Sizes (1, 2, 4, 8, 16): 3-4 pad to 4 (key 3), 5-8 to 8 (key 6: 5 takes it), 9-16 to
    16 (key 6; key 17 is above 16), 17-20 are not padded (key 17)."""
    schedule = BatchSchedule.from_sglang(
        config(_1=3, _3=2, _6=1, _17=0), max_batch=20, cuda_graph_bs=[16, 8, 4, 2, 1, 8]
    )
    # fmt: off
    assert dense(schedule) == [
        3, 3,                                            # 1, 2
        2, 2,                                            # 3-4 -> 4
        1, 1, 1, 1,                                      # 5-8 -> 8
        1, 1, 1, 1, 1, 1, 1, 1,                          # 9-16 -> 16
        0, 0, 0, 0,                                      # 17-20: no padding
    ]
    # fmt: on
    # Without CUDA graphs nothing is padded: the keys are plain lower bounds.
    schedule = BatchSchedule.from_sglang(
        config(_1=3, _3=2, _6=1, _17=0), max_batch=8, cuda_graph_bs=[]
    )
    assert dense(schedule) == [3, 3, 2, 2, 2, 1, 1, 1]


def test_keys_may_come_in_any_order_and_as_integers():
    shuffled = {
        "33": {"candidate_steps": [0]},
        1: {"candidate_steps": [4]},
        "9": {"candidate_steps": [2, 2]},
    }
    schedule = BatchSchedule.from_sglang(shuffled, max_batch=42)
    assert dense(schedule) == dense(
        BatchSchedule.from_sglang(config(_1=4, _9=2, _33=0), max_batch=42)
    )


def test_k_above_k_max_is_clamped_naming_the_keys_read():
    """Key 1000 is never read up to max_batch 16, so it is not named."""
    with pytest.warns(
        SpecrlWarning, match=r"K above 5 \(k_max\) at key '9': K=6; clamped to 5"
    ) as record:
        schedule = BatchSchedule.from_sglang(config(_1=4, _9=6, _1000=9), max_batch=16, k_max=5)
    assert "1000" not in str(record[0].message)
    assert dense(schedule) == [4] * 8 + [5] * 8


# ---------------------------------------------------------------------- the export


def test_sglang_export_writes_lower_bounds_at_padding_group_starts():
    table = table_from_json(plain_json())  # batch 1-4 / 5-8 / 9-16
    with strict():
        assert to_sglang(table, acceptance=0.9) == config(_1=4, _5=3, _9=1)
        assert to_sglang(table, acceptance=0.3) == config(_1=1, _5=0)  # equal neighbours merged
        # Sizes (1, 2, 4, 8, 16): 5-8 is one group, 9-16 another; the table is constant on them.
        assert to_sglang(table, acceptance=0.9, cuda_graph_bs=(1, 2, 4, 8, 16)) == config(
            _1=4, _5=3, _9=1
        )
    assert list(to_sglang(table, acceptance=0.9)) == ["1", "5", "9"]  # ascending strings


def test_sglang_export_takes_the_context_bin_holding_context_len():
    table = table_from_json(context_json())
    with strict():
        assert to_sglang(table, acceptance=0.9) == config(_1=4, _5=3, _9=1)
        assert to_sglang(table, acceptance=0.9, context_len=511) == config(_1=4, _5=3, _9=1)
        assert to_sglang(table, acceptance=0.9, context_len=512) == config(_1=4, _9=2)


def test_a_group_whose_k_differs_takes_the_padded_sizes_k_with_a_warning():
    """Buckets 1-4 / 5-9 / 10-16: batch 9 pads to 10, so SGLang runs 9 and 10 at one K; the
    table's K at 10 (1) wins and batch 9 loses its 3."""
    obj = plain_json()
    obj["batch_buckets"] = [[1, 4], [5, 9], [10, 16]]
    table = table_from_json(obj)
    with pytest.warns(SpecrlWarning, match=r"batch 9-10 \(padded to 10\): K 3/1 -> 1$"):
        written = to_sglang(table, acceptance=0.9)
    assert written == config(_1=4, _5=3, _9=1)
    schedule = BatchSchedule.from_sglang(written, max_batch=16)
    controller = at_acceptance(LookupController(table), 0.9)
    differs = [b for b in range(1, 17) if schedule.k_for(b) != controller.choose_k(b)]
    assert differs == [9]


def test_the_group_above_max_batch_takes_the_k_at_max_batch():
    """max_batch 35: 33-35 pad to 40, above the table; the controller clamps 40 to 35."""
    obj = plain_json()
    obj["max_batch"] = 35
    obj["batch_buckets"] = [[1, 4], [5, 33], [34, 35]]
    table = table_from_json(obj)
    with pytest.warns(SpecrlWarning, match=r"batch 33-35 \(padded to 40\): K 3/1 -> 1"):
        written = to_sglang(table, acceptance=0.9)
    assert written == config(_1=4, _5=3, _33=1)


def test_the_controller_clamp_case_changes_batch_15():
    """The table of test_table's clamp test: batch 15 and 16 pad to 16, K 3 and 1."""
    obj = plain_json()
    obj["batch_buckets"] = [[1, 4], [5, 15], [16, 16]]
    table = table_from_json(obj)
    with pytest.warns(SpecrlWarning, match=r"batch 15-16 \(padded to 16\): K 3/1 -> 1"):
        assert to_sglang(table, acceptance=0.9) == config(_1=4, _5=3, _15=1)


def test_a_table_that_never_drafts_is_written_with_a_warning():
    obj = plain_json()
    obj["k"] = [[0, 0, 0]] * 3
    with pytest.warns(SpecrlWarning, match="SGLang would load the draft model and never use it"):
        assert to_sglang(table_from_json(obj), acceptance=0.5) == config(_1=0)


def test_sglang_export_refuses_bad_capture_sizes():
    table = table_from_json(plain_json())
    for sizes in ([0, 8], "8", [True], [2.0], None, {8: 8}):
        with pytest.raises(SpecrlError, match="cuda_graph_bs must be a list of CUDA-graph"):
            to_sglang(table, acceptance=0.9, cuda_graph_bs=sizes)


# ---------------------------------------------------------------------- above max_batch


def test_above_max_batch_each_format_against_the_controller():
    """The table covers batch 1-16 (K 4/3/1 at 0.9). Above it the controller and vLLM keep
    the last range's K; TensorRT-LLM drafts nothing above its last key; SGLang pads the
    batch, finds every padded size above the last key and keeps its K too."""
    table = table_from_json(plain_json())
    controller = at_acceptance(LookupController(table), 0.9)
    with strict():
        vllm = BatchSchedule.from_vllm(to_vllm(table, acceptance=0.9), max_batch=300)
        trtllm = BatchSchedule.from_trtllm(to_trtllm(table, acceptance=0.9), max_batch=300)
        sglang = BatchSchedule.from_sglang(to_sglang(table, acceptance=0.9), max_batch=300)
    for batch in range(1, 17):
        k = controller.choose_k(batch)
        assert vllm.k_for(batch) == trtllm.k_for(batch) == sglang.k_for(batch) == k, batch
    above = range(17, 301)
    assert {controller.choose_k(b) for b in above} == {1}
    assert all(vllm.k_for(b) == controller.choose_k(b) for b in above)
    assert all(sglang.k_for(b) == controller.choose_k(b) for b in above)
    assert {trtllm.k_for(b) for b in above} == {0}


def test_above_max_batch_when_max_batch_is_not_a_capture_size():
    """max_batch 15: batch 15 and 16 both pad to 16, whose K is the table's at 15."""
    obj = plain_json()
    obj["max_batch"] = 15
    obj["batch_buckets"] = [[1, 4], [5, 8], [9, 15]]
    table = table_from_json(obj)
    controller = at_acceptance(LookupController(table), 0.9)
    with strict():
        sglang = BatchSchedule.from_sglang(to_sglang(table, acceptance=0.9), max_batch=200)
    assert [sglang.k_for(b) for b in range(1, 201)] == [
        controller.choose_k(b) for b in range(1, 201)
    ]


# ---------------------------------------------------------------------- round trips


@pytest.mark.parametrize("acceptance", [0.0, 0.3, 0.5, 0.6, 0.9, 1.0])
@pytest.mark.parametrize("make", [plain_json, context_json])
def test_round_trip_equals_the_tables_column(make, acceptance):
    table = table_from_json(make())
    controller = at_acceptance(LookupController(table), acceptance)
    for context in (None, 1, 511, 512, 10**6):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warnings.filterwarnings("ignore", "the table drafts nothing", SpecrlWarning)
            written = to_sglang(table, acceptance=acceptance, context_len=context)
            schedule = BatchSchedule.from_sglang(json.loads(json.dumps(written)), max_batch=60)
        for batch in range(1, 61):
            assert schedule.k_for(batch) == controller.choose_k(batch, context_len=context), batch


def _padded(batch: int, sizes) -> int:
    return min((g for g in sizes if g >= batch), default=batch)


def test_random_tables_round_trip_through_the_padded_size():
    """For any table and capture sizes, SGLang reads back at batch b the table's K at b's
    padded size (clamped to max_batch), and the export warns exactly when that differs
    from the table's own K somewhere."""
    rng = random.Random(24055)
    warned_cases = 0
    for case in range(150):
        max_batch = rng.randint(1, 180)
        edges = sorted(rng.sample(range(2, max_batch + 1), min(max_batch - 1, rng.randint(0, 6))))
        buckets = [[lo, hi - 1] for lo, hi in zip([1, *edges], [*edges, max_batch + 1])]
        k = [[rng.randint(0, 4)] for _ in buckets]
        obj = plain_json()
        obj.update(
            max_batch=max_batch,
            batch_buckets=buckets,
            acceptance_edges=[0, 1],
            k=k,
            stale_k=[row[0] for row in k],
        )
        table = table_from_json(obj)
        sizes = (
            SGLANG_CUDA_GRAPH_BS
            if case % 3 == 0
            else sorted(rng.sample(range(1, 200), rng.randint(0, 12)))
        )
        own = {b: k[i][0] for i, (lo, hi) in enumerate(buckets) for b in range(lo, hi + 1)}
        expected = {b: own[min(_padded(b, sizes), max_batch)] for b in range(1, max_batch + 60)}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            written = to_sglang(table, acceptance=0.5, cuda_graph_bs=sizes)
        changed = any(expected[b] != own[b] for b in own)
        warned = any("padded to" in str(w.message) for w in caught)
        assert warned == changed, (buckets, k, sizes)
        warned_cases += warned
        keys = [int(key) for key in written]
        assert keys[0] == 1 and keys == sorted(keys) and list(written) == [str(x) for x in keys]
        values = [v["candidate_steps"] for v in written.values()]
        assert all(len(v) == 1 for v in values)
        assert all(a != b for a, b in zip(values, values[1:]))  # equal neighbours merged
        schedule = BatchSchedule.from_sglang(written, max_batch=max_batch + 59, cuda_graph_bs=sizes)
        assert {b: schedule.k_for(b) for b in expected} == expected, (buckets, k, sizes)
    assert 20 <= warned_cases <= 130, warned_cases


# ---------------------------------------------------------------------- refusals


def _at_9(value) -> dict:
    """A valid key 1 and ``value`` at key 9."""
    return {"1": {"candidate_steps": [4]}, "9": value}


def _key(key) -> dict:
    """A valid key 1 and a second key ``key``."""
    return {"1": {"candidate_steps": [4]}, key: {"candidate_steps": [2]}}


LOWER_BOUNDS = "keys are batch-size lower bounds, integers >= 1"
STEPS = "candidate_steps"
MALFORMED = [
    ("not an object", [[1, 4]], r"expected an object"),
    ("empty", {}, r"the SGLang config is empty"),
    ("word key", _key("x"), rf"key 'x': {LOWER_BOUNDS}"),
    ("zero key", {"0": {STEPS: [4]}, "1": {STEPS: [2]}}, rf"key '0': {LOWER_BOUNDS}"),
    ("negative key", _key("-9"), rf"key '-9': {LOWER_BOUNDS}"),
    ("fractional key", _key("9.5"), rf"key '9\.5': {LOWER_BOUNDS}"),
    ("superscript key", _key("²"), rf"key '²': {LOWER_BOUNDS}"),
    ("huge key", _key("9" * 5000), rf"key '9999.*: {LOWER_BOUNDS}"),
    (
        "no key 1",
        {"2": {STEPS: [4]}, "9": {STEPS: [2]}},
        r"no key '1' \(the smallest is 2\); the smallest key must be 1",
    ),
    ("duplicate key", _key("01"), r"key '01': batch size 1 is given twice \(also as key '1'\)"),
    ("value a list", _at_9([2]), r"key '9' = \[2\]: each value is an object \{'candidate_steps'"),
    ("value a number", _at_9(2), r"key '9' = 2: each value is an object"),
    (
        "ema_alpha",
        _at_9({STEPS: [2], "ema_alpha": 0.2}),
        r"key '9': unknown keys \['ema_alpha'\]; specrl reads only 'candidate_steps'",
    ),
    ("no candidates key", _at_9({}), r"key '9': no 'candidate_steps'"),
    (
        "empty candidates",
        _at_9({STEPS: []}),
        r"key '9': candidate_steps = \[\]: must be a non-empty",
    ),
    (
        "candidates a number",
        _at_9({STEPS: 2}),
        r"key '9': candidate_steps = 2: must be a non-empty",
    ),
    ("negative K", _at_9({STEPS: [-1]}), r"key '9': candidate_steps = \[-1\]: .*integers 0\.\.256"),
    ("fractional K", _at_9({STEPS: [1.5]}), r"key '9': candidate_steps = \[1\.5\]"),
    ("boolean K", _at_9({STEPS: [True]}), r"key '9': candidate_steps = \[True\]"),
    ("string K", _at_9({STEPS: ["2"]}), r"key '9': candidate_steps = \['2'\]"),
    ("huge K", _at_9({STEPS: [10**30]}), r"key '9': candidate_steps = \[10+\]"),
    (
        "two candidates",
        _at_9({STEPS: [1, 3]}),
        r"key '9': candidate_steps = \[1, 3\] holds 2 candidates; specrl reads static tables only",
    ),
]


@pytest.mark.parametrize("obj, match", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_configs_are_refused_naming_the_key(tmp_path, obj, match):
    with pytest.raises(SpecrlError, match=match):
        BatchSchedule.from_sglang(copy.deepcopy(obj), max_batch=16, source="cfg.json")
    if isinstance(obj, dict) and obj:  # the file reader takes it for SGLang's, and refuses it
        for wrapped in (obj, {"speculative_config": obj}):
            with pytest.raises(SpecrlError, match=match):
                BatchSchedule.from_file(write(tmp_path, wrapped, "bad.json"), max_batch=16)


def test_malformed_capture_sizes_are_refused():
    for sizes in ([0], "8", [1, None], 8):
        with pytest.raises(SpecrlError, match=r"cfg\.json: cuda_graph_bs must be a list"):
            BatchSchedule.from_sglang(
                config(_1=4), max_batch=16, cuda_graph_bs=sizes, source="cfg.json"
            )


# ---------------------------------------------------------------------- files


def test_export_file_says_the_operating_point_the_sizes_and_the_version(tmp_path):
    table = table_from_json(plain_json())
    with strict():
        obj = export_file(table, fmt="sglang", acceptance=0.9)
    assert obj["speculative_config"] == config(_1=4, _5=3, _9=1)
    note = obj["specrl"]
    assert note["format"] == "sglang" and note["acceptance"] == 0.9 and note["context_len"] is None
    assert note["cuda_graph_bs"] == list(SGLANG_CUDA_GRAPH_BS)
    assert (
        "PR #24055" in note["sglang_version"] and "at least 2 candidate" in note["sglang_version"]
    )
    assert note["provenance"] == table.provenance
    with pytest.raises(SpecrlError, match="give --acceptance"):
        export_file(table, fmt="sglang")
    with pytest.raises(SpecrlError, match="cuda_graph_bs must be"):
        export_file(table, fmt="sglang", acceptance=0.9, cuda_graph_bs=[0])


def test_from_file_reads_the_export_and_the_bare_config(tmp_path):
    table = table_from_json(plain_json())
    exported = write(tmp_path, export_file(table, fmt="sglang", acceptance=0.9), "exp.json")
    bare = write(tmp_path, to_sglang(table, acceptance=0.9), "bare.json")
    for path in (exported, bare):
        schedule = BatchSchedule.from_file(path, max_batch=40, k_max=4)
        assert schedule.name == f"schedule:{path.stem}"
        assert dense(schedule) == [4] * 4 + [3] * 4 + [1] * 32


def test_from_file_pads_with_the_sizes_the_file_was_exported_for(tmp_path):
    """Exported for sizes (1, 2, 4, 8, 16), 5-8 share one graph: batch 5-6 (K 3 in the
    table) run with 7-8 (K 2) at the K of 8. The note records the sizes, and the reader pads
    with them unless told others."""
    obj = plain_json()
    obj["batch_buckets"] = [[1, 4], [5, 6], [7, 16]]
    obj["k"] = [[4, 4, 4], [3, 3, 3], [2, 2, 2]]
    table = table_from_json(obj)
    sizes = (16, 8, 4, 2, 1)
    with pytest.warns(SpecrlWarning, match=r"batch 5-8 \(padded to 8\): K 3/2 -> 2"):
        exported = export_file(table, fmt="sglang", acceptance=0.9, cuda_graph_bs=sizes)
    assert exported["speculative_config"] == config(_1=4, _5=2)
    assert exported["specrl"]["cuda_graph_bs"] == [1, 2, 4, 8, 16]
    assert dense(BatchSchedule.from_file(write(tmp_path, exported), max_batch=8)) == [
        *(4, 4, 4, 4),
        *(2, 2, 2, 2),
    ]
    # Sizes (4, 8): batch 1-4 pad to 4, where key 3 applies; without the note they don't.
    bare = config(_1=4, _3=3, _5=2)
    noted = write(tmp_path, {"speculative_config": bare, "specrl": {"cuda_graph_bs": [4, 8]}})
    assert dense(BatchSchedule.from_file(noted, max_batch=8)) == [3, 3, 3, 3, 2, 2, 2, 2]
    plain = write(tmp_path, {"speculative_config": bare}, "plain.json")
    assert dense(BatchSchedule.from_file(plain, max_batch=8)) == [4, 4, 3, 3, 2, 2, 2, 2]
    # An explicit cuda_graph_bs wins over the note.
    told = BatchSchedule.from_file(noted, max_batch=8, cuda_graph_bs=[])
    assert dense(told) == [4, 4, 3, 3, 2, 2, 2, 2]
    junk = write(tmp_path, {"speculative_config": bare, "specrl": {"cuda_graph_bs": "all"}})
    with pytest.raises(SpecrlError, match=r"table\.json: specrl\.cuda_graph_bs must be a list"):
        BatchSchedule.from_file(junk, max_batch=8)


def test_from_file_names_sglang_when_it_finds_no_table(tmp_path):
    path = write(tmp_path, {"1": 4})
    with pytest.raises(
        SpecrlError, match=r"no .*'draft_len_schedule', nor SGLang 'candidate_steps' objects"
    ):
        BatchSchedule.from_file(path, max_batch=8)


def test_export_cli_writes_sglang(tmp_path):
    from specrl.cli import main

    native, out = write(tmp_path, plain_json()), tmp_path / "sglang.json"
    args = ["export", "--table", str(native), "--format", "sglang", "--acceptance", "0.9"]
    assert main([*args, "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["speculative_config"] == config(_1=4, _5=3, _9=1)
    assert dense(BatchSchedule.from_file(out, max_batch=16)) == [4] * 4 + [3] * 4 + [1] * 8


# ---------------------------------------------------------------------- fuzz

KEY_JUNK = ["0", "-1", "01", " 2", "+3", "1.0", "x", "", "²", "9" * 5000, "1e3"]


def _rename_a_key(obj: dict, rng: random.Random) -> None:
    """Rename one key of the SGLang object (``obj`` or its ``speculative_config``)."""
    target = obj.get("speculative_config", obj)
    if isinstance(target, dict) and target:
        key = rng.choice(list(target))
        target[rng.choice(KEY_JUNK + [str(rng.randint(1, 200))])] = target.pop(key)


def test_fuzzed_sglang_files_load_and_behave_or_raise_specrl_error(tmp_path):
    """Random mutations of a valid SGLang file, bare or as exported: each loads (and gives a
    K in 0..k_max at every batch size) or is refused with a SpecrlError, never another
    exception."""
    assert JUNK  # the same junk values as the native table's fuzz
    table = table_from_json(plain_json())
    exported = export_file(table, fmt="sglang", acceptance=0.9)
    del exported["specrl"]["provenance"]  # mutations there are the native fuzz's business
    bare = config(_1=4, _5=3, _12=1, _33=0)
    rng = random.Random(20261216)
    outcomes = {"loaded": 0, "rejected": 0}
    for i in range(300):
        obj = copy.deepcopy(exported if i % 2 else bare)
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.25:
                _rename_a_key(obj, rng)
            else:
                obj = _mutate(obj, rng)
            if isinstance(obj, str):
                break
        path = write(tmp_path, obj if isinstance(obj, str) else json.dumps(obj), f"{i}.json")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SpecrlWarning)
                schedule = BatchSchedule.from_file(path, max_batch=50, k_max=4)
        except SpecrlError:
            outcomes["rejected"] += 1
            continue
        outcomes["loaded"] += 1
        for batch in range(0, 60):
            k = schedule.k_for(batch)
            assert type(k) is int and 0 <= k <= 4, (path.read_text()[:300], batch)
    assert outcomes["loaded"] >= 40 and outcomes["rejected"] >= 100, outcomes
