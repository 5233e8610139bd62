"""Read an offline wandb run back: wandb 0.31 has no Python reader for its ``.wandb``
transaction log, so this parses the log's blocks and wandb's protobuf ``Record``s."""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path


def log_records(path: Path):
    """The records of a wandb transaction log (``run-ID.wandb``): a 7-byte header
    (``:W&B``, magic, version), then LevelDB log blocks of 32 KiB whose chunks (checksum,
    length, type: full, first, middle, last) carry one protobuf ``Record`` each."""
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb transaction log"
    block, header = 32768, 7
    pos, parts = header, []
    while pos + header <= len(data):
        left = block - pos % block
        if left < header:  # the block's tail is padding
            pos += left
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos : pos + header])
        if pos + header + length > len(data):
            return  # a chunk wandb's service is still writing: the log is not complete yet
        chunk = data[pos + header : pos + header + length]
        pos += header + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            parts = [chunk]
        elif kind == 3:
            parts.append(chunk)
        elif kind == 4:
            yield b"".join([*parts, chunk])


def _key(item) -> str:
    """An item's key; nested keys (``{"comparison": {"nrows": 2}}``) joined by ``/``."""
    return item.key or "/".join(item.nested_key)


@dataclass
class WandbRun:
    """What one offline run logged. Values are parsed JSON: NaN stays NaN in the history,
    while wandb stores a NaN summary value as null (None)."""

    path: Path
    """The run directory (``offline-run-*``)."""
    name: str = ""
    group: str = ""
    job_type: str = ""
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    """One dict per logged step."""
    summary: dict = field(default_factory=dict)
    """The final summary (every update applied in order)."""

    def columns(self) -> dict[str, list]:
        """History by key: every value logged under it, in step order."""
        out: dict[str, list] = {}
        for row in self.history:
            for key, value in row.items():
                out.setdefault(key, []).append(value)
        return out


def _records(path: Path, wait_s: float):
    """The log's parsed records, once they end with the run's ``exit`` record: ``finish()``
    can return while wandb's service is still writing the offline log (seen on a loaded
    machine: the last history rows arrived after the test had read the file; once, a record
    half written read as corrupt). Waits up to ``wait_s`` for the exit record, then returns
    what is there, or raises the parse error that lasted."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    deadline = time.monotonic() + wait_s
    while True:
        records = []
        try:
            for payload in log_records(path):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(payload)
                records.append(record)
        except DecodeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
            continue
        if (records and records[-1].WhichOneof("record_type") == "exit") or (
            time.monotonic() > deadline
        ):
            return records
        time.sleep(0.2)


def read_run(run_dir: Path, wait_s: float = 60.0) -> WandbRun:
    """Parse the one ``run-*.wandb`` log in ``run_dir`` (complete: see :func:`_records`)."""
    logs = list(Path(run_dir).glob("run-*.wandb"))
    assert len(logs) == 1, f"expected one run-*.wandb in {run_dir}, found {logs}"
    run = WandbRun(path=Path(run_dir))
    for record in _records(logs[0], wait_s):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.name, run.group = record.run.display_name, record.run.run_group
            run.job_type = record.run.job_type
            for item in record.run.config.update:
                run.config[_key(item)] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                run.config[_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            run.history.append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            for item in record.summary.update:
                run.summary[_key(item)] = json.loads(item.value_json)
            for item in record.summary.remove:
                run.summary.pop(_key(item), None)
    return run
