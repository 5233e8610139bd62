"""Output files: written whole or not at all, and an unwritable --out refused before the work."""

from __future__ import annotations

import json
import os

import pytest

from specrl.cli import main
from specrl.errors import SpecrlError
from specrl.files import check_output, write_atomic, write_json


def test_write_atomic_makes_the_directory_and_replaces_the_file(tmp_path):
    path = tmp_path / "new" / "dir" / "t.json"
    write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    write_atomic(path, b"[2]\n")
    assert path.read_bytes() == b"[2]\n"
    assert os.listdir(path.parent) == ["t.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_part(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_text("old\n")

    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(SpecrlError, match=r"could not write .*t\.json \(No space left on device\)"):
        write_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["t.json"]


def test_check_output_names_the_option_and_the_fix(tmp_path):
    with pytest.raises(SpecrlError, match=r"--out .* is a directory; give a file path in it"):
        check_output(tmp_path, "--out")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SpecrlError, match=r"--json .*: cannot create the directory .*file"):
        check_output(blocker / "sub" / "r.json", "--json")
    made = check_output(tmp_path / "a" / "b.json", "--csv")
    assert made.parent.is_dir() and not made.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["profile", "--preset", "micro", "--batch-sizes", "1", "--out", "{blocker}/p.json"],
        ["export", "--table", "{missing}", "--out", "{blocker}/t.json"],
        ["compare", "--workload", "ramp", "--json", "{blocker}/c.json"],
        [
            "bench",
            "engine",
            "--target",
            "{missing}",
            "--draft",
            "{missing}",
            "--json",
            "{blocker}/b",
        ],
    ],
    ids=["profile", "export", "compare", "bench"],
)
def test_an_unwritable_output_is_refused_before_any_work(tmp_path, capsys, argv):
    blocker = tmp_path / "file"
    blocker.write_text("")
    args = [a.format(blocker=blocker, missing=tmp_path / "none.json") for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err
    # The output is checked first: not the missing table, not a measurement.
    assert "cannot create the directory" in err and str(blocker) in err


def test_write_atomic_writes_through_a_symlink_and_never_over_a_device(tmp_path):
    served = tmp_path / "deploy" / "served.json"
    served.parent.mkdir()
    served.write_text("old\n")
    link = tmp_path / "current.json"
    link.symlink_to(served)
    write_atomic(link, "new\n")
    assert link.is_symlink() and served.read_text() == "new\n"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(SpecrlError, match=r"pipe: it is not a regular file"):
        write_atomic(fifo, "x")
    with pytest.raises(SpecrlError, match=r"--out .*pipe is not a regular file"):
        check_output(fifo, "--out")
    assert not fifo.is_file() and fifo.exists()


def test_a_key_given_twice_is_refused_not_silently_overwritten(tmp_path):
    from specrl.table import load_table
    from specrl.workload.user_prompts import load_prompts

    table = tmp_path / "t.json"
    table.write_text('{"format": "specrl-k-table", "k_max": 4, "k_max": 2}')
    with pytest.raises(SpecrlError, match=r"t\.json: key 'k_max' appears twice in one object"):
        load_table(table)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a", "temperature": 0, "temperature": 1}\n')
    with pytest.raises(SpecrlError, match=r"line 1: key 'temperature' appears twice"):
        load_prompts(prompts)


def test_a_version_must_be_an_integer():
    from specrl.files import check_header

    header = {"format": "f", "version": 2.0}
    with pytest.raises(SpecrlError, match=r"field 'version' is 2\.0; this specrl reads version 2"):
        check_header(header, "x.json", fmt="f", version=2, what="thing", remake="remake it")
    check_header({"format": "f", "version": 2}, "x.json", fmt="f", version=2, what="t", remake="r")


def test_wandb_online_without_credentials_says_how_to_log_in(monkeypatch):
    import wandb

    from specrl.report.dashboard import init_wandb

    def no_key(**kwargs):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", no_key)
    with pytest.raises(SpecrlError, match=r"wandb online run could not start .*`wandb sync` later"):
        init_wandb(mode="online", project="specrl")


def test_train_and_demo_refuse_an_out_they_cannot_write(tmp_path):
    from specrl.demo import DemoOptions, run_demo
    from specrl.train import TrainConfig, train

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SpecrlError, match=r"--out .*file is a file; a run needs a directory"):
        train(TrainConfig(out=str(blocker)), progress=False)
    with pytest.raises(
        SpecrlError, match=r"--out .*file/sub/run: cannot write there \(Not a directory\)"
    ):
        train(TrainConfig(out=str(blocker / "sub" / "run")), progress=False)
    with pytest.raises(SpecrlError, match=r"--out .*file/runs: cannot write there"):
        run_demo(DemoOptions(out=str(blocker / "runs")))
    assert blocker.read_text() == ""
