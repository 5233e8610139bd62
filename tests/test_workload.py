"""Workload traces: seeded, replayable, validated on load."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specrl.errors import SpecrlError
from specrl.workload import (
    DOMAINS,
    PRESETS,
    LengthDist,
    Request,
    TraceDriver,
    load_trace,
    make_trace,
    preset_trace,
    ramp,
    resolve_prompt,
)
from specrl.workload.prompts import token_streams
from specrl.workload.trace_file import trace_from_json


def test_domains_match_the_corpus():
    from specrl.models.corpus import DOMAINS as CORPUS_DOMAINS

    assert DOMAINS == CORPUS_DOMAINS


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_is_seeded_and_round_trips(preset, tmp_path):
    a = preset_trace(preset, seed=3, n_requests=40, peak=16)
    b = preset_trace(preset, seed=3, n_requests=40, peak=16)
    c = preset_trace(preset, seed=4, n_requests=40, peak=16)
    assert a.to_json() == b.to_json()
    assert a.requests != c.requests
    path = tmp_path / "trace.json"
    a.save(path)
    assert load_trace(path).to_json() == a.to_json()


def test_output_lengths_follow_the_stated_clipped_lognormal():
    dist = LengthDist(median=48, sigma=0.6, lo=8, hi=160)
    z = np.random.default_rng(0).standard_normal(1000)
    expected = np.clip(np.rint(48 * np.exp(0.6 * z)), 8, 160)
    assert dist.sample(np.random.default_rng(0), 1000).tolist() == expected.tolist()


def test_ramp_schedule_goes_1_to_64_to_1():
    sched = ramp(260, peak=64)
    levels = [c for _, c in sched]
    assert levels == [1, 2, 4, 8, 16, 32, 64, 32, 16, 8, 4, 2, 1]
    assert [s for s, _ in sched] == sorted({s for s, _ in sched})


def _replay(trace, steps_per_request: int) -> list[int]:
    """Serve each request for a fixed number of steps; return in-flight counts per step."""
    driver = TraceDriver(trace)
    ages: list[int] = [0] * len(driver.due())
    in_flight = []
    while not driver.done:
        in_flight.append(len(ages))
        ages = [a + 1 for a in ages]
        finished = sum(a >= steps_per_request for a in ages)
        ages = [a for a in ages if a < steps_per_request]
        driver.advance(0.01, finished)
        ages += [0] * len(driver.due())
    return in_flight


def test_replaying_the_ramp_climbs_to_64_and_back():
    trace = preset_trace("ramp", seed=0, n_requests=400, peak=64)
    in_flight = _replay(trace, steps_per_request=5)
    peak_at = int(np.argmax(in_flight))
    assert in_flight[0] == 1 and max(in_flight) == 64 and in_flight[-1] == 1
    assert 0 < peak_at < len(in_flight) - 1
    assert _replay(trace, 5) == in_flight


def test_open_loop_skips_idle_time_to_the_next_arrival():
    trace = make_trace(name="t", seed=0, n_requests=3, load={"kind": "open", "rate_per_s": 1.0})
    arrivals = [r.arrival_s for r in trace.requests]
    driver = TraceDriver(trace)
    assert driver.due() == trace.requests[:1]
    assert driver.clock_s == arrivals[0] and driver.idle_s == arrivals[0]
    driver.advance(0.001, 1)
    assert driver.due() == trace.requests[1:2]
    assert driver.clock_s == arrivals[1]
    assert driver.idle_s == pytest.approx(arrivals[1] - 0.001)


def test_resolve_prompt_wraps_around_the_stream():
    streams = {"code": [1, 2, 3, 4, 5]}
    assert resolve_prompt(streams, Request("code", 8, 4, 10)) == [4, 5, 1, 2]
    assert resolve_prompt(streams, Request("code", 0, 12, 10)) == [1, 2, 3, 4, 5] * 2 + [1, 2]
    with pytest.raises(SpecrlError, match="domain 'prose'"):
        resolve_prompt(streams, Request("prose", 0, 2, 1))


def test_token_streams_join_documents_with_eos():
    class Tok:
        eos_token_id = 0

        def encode(self, text, add_special_tokens=False, verbose=True):
            return [ord(ch) for ch in text]

    docs = {"code": ["ab", "c"], "prose": [], "hard": ["d"]}
    assert token_streams(Tok(), docs) == {"code": [97, 98, 0, 99, 0], "prose": [], "hard": [100, 0]}


def _write(tmp_path, obj) -> str:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)
    return str(path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t["requests"][1].update(domain="poetry"), r"requests\[1\]\.domain.*poetry"),
        (lambda t: t["requests"][0].pop("max_new_tokens"), r"requests\[0\].*'max_new_tokens'"),
        (lambda t: t["requests"][2].update(prompt_len=0), r"requests\[2\].*prompt_len >= 1"),
        (lambda t: t.update(version=99), r"'version' is 99"),
        (lambda t: t["load"].update(schedule=[[5, 2]]), r"schedule.*\[0, concurrency\]"),
        (lambda t: t["load"].update(schedule=[[0, 2], [0, 3]]), r"schedule\[1\]"),
        (lambda t: t["load"].update(kind="sometimes"), r"load\.kind"),
        (lambda t: t["domains"].update(poetry=0.5), r"domains: unknown domain 'poetry'"),
        (lambda t: t.update(requests=[]), r"requests: a trace needs at least one"),
        (lambda t: t["output_lengths"].update(lo=0), r"output_lengths"),
        (lambda t: t["requests"][1].update(temperature=-0.5), r"requests\[1\]\.temperature"),
        (lambda t: t["requests"][1].update(temperature=float("nan")), r"\.temperature"),
        (lambda t: t["requests"][0].update(top_p=0), r"requests\[0\]\.top_p: must be in"),
        (lambda t: t["requests"][0].update(top_p=1.5), r"requests\[0\]\.top_p: must be in"),
        (lambda t: t["requests"][0].pop("temperature"), r"requests\[0\].*'temperature'"),
        (lambda t: t["sampling"].update(hot=1.0), r"sampling: unknown setting 'hot'"),
        (
            lambda t: t["requests"][0].update(max_new_tokens=30.0),
            r"requests\[0\]\.max_new_tokens: expected an integer, got float 30\.0$",
        ),
        (
            lambda t: t["requests"].__setitem__(0, [1, 2]),
            r"requests\[0\]: expected an object with field 'domain', got list$",
        ),
        (
            lambda t: t.pop("prompt_lengths"),
            r"bad\.json\.prompt_lengths: missing; a trace records the length distribution",
        ),
        (
            lambda t: t.update(domains={"code": 1.0, "prose": 0.0}),
            r"requests\[\d\]\.domain: 'prose' has no weight in .*bad\.json\.domains",
        ),
        (lambda t: t["domains"].update(prose=0.0, code=0.0, hard=0), r"domains: give at least"),
        (lambda t: t["domains"].update(code=float("inf")), r"domains\.code: weight must be a fin"),
        (lambda t: t["sampling"].update(greedy=float("nan")), r"sampling\.greedy: weight must"),
        (lambda t: t.update(sampling={}), r"sampling: give at least one setting a weight > 0"),
        (lambda t: t["load"].update(rate_per_s=3), r"bad\.json\.load: unknown key 'rate_per_s'"),
        (lambda t: t["prompt_lengths"].update(mean=3), r"prompt_lengths: unknown key 'mean'"),
    ],
)
def test_malformed_trace_is_rejected_naming_the_file_and_field(tmp_path, edit, message):
    obj = preset_trace("steady-8", seed=0, n_requests=4).to_json()
    edit(obj)
    path = _write(tmp_path, obj)
    with pytest.raises(SpecrlError, match=message) as err:
        load_trace(path)
    assert path in str(err.value)


@pytest.mark.parametrize("arrival", [float("nan"), float("inf")])
def test_an_open_loop_arrival_must_be_a_finite_number(tmp_path, arrival):
    obj = preset_trace("poisson", seed=0, n_requests=4).to_json()
    obj["requests"][0]["arrival_s"] = arrival  # NaN once served steps at batch 0 forever
    with pytest.raises(SpecrlError, match=r"requests\[0\]\.arrival_s: expected a finite number"):
        load_trace(_write(tmp_path, obj))


def test_missing_or_non_json_trace_file(tmp_path):
    with pytest.raises(SpecrlError, match=r"not found.*specrl workload"):
        load_trace(tmp_path / "nope.json")
    with pytest.raises(SpecrlError, match="not valid JSON") as err:
        load_trace(_write(tmp_path, "{not json"))
    # The remedy never writes over the user's own file.
    assert str(err.value).endswith(
        "; fix it, or write one with `specrl workload --preset ramp --out TRACE.json`"
    )
    with pytest.raises(SpecrlError, match="not a specrl trace"):
        load_trace(_write(tmp_path, {"format": "other"}))


def test_unknown_keys_in_a_trace_file_are_refused(tmp_path):
    obj = preset_trace("ramp", n_requests=4).to_json()
    obj["requests"][2]["temprature"] = 0.7
    with pytest.raises(SpecrlError, match=r"requests\[2\]: unknown key 'temprature'; the keys"):
        load_trace(_write(tmp_path, obj))
    obj = preset_trace("ramp", n_requests=4).to_json()
    obj["comment"] = "x"
    with pytest.raises(SpecrlError, match="unknown key 'comment'; the keys are format, version"):
        load_trace(_write(tmp_path, obj))


def test_unknown_preset_names_the_choices():
    with pytest.raises(SpecrlError, match="unknown workload preset 'busy'.*ramp"):
        preset_trace("busy")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_requests": 0}, r"n_requests must be an integer >= 1 \(leave it out for the preset"),
        ({"rate_per_s": 2.0}, r"unknown argument\(s\) 'rate_per_s'; .* for poisson, rate_per_s"),
        ({"n_requests": "8"}, r"n_requests must be an integer >= 1.*got '8'"),
        ({"peak": 0}, r"peak must be an integer >= 1, got 0"),
        ({"peak": 2.5}, r"peak must be an integer >= 1, got 2.5"),
        ({"n_request": 5}, r"unknown argument\(s\) 'n_request'; valid: n_requests, peak, domains"),
    ],
)
def test_preset_arguments_are_checked_naming_the_argument(kwargs, message):
    with pytest.raises(SpecrlError, match=message):
        preset_trace("ramp", **kwargs)


def test_an_open_loop_load_needs_a_rate():
    from specrl.workload.presets import make_trace

    for load in ({"kind": "open"}, {"kind": "open", "rate_per_s": 0}):
        with pytest.raises(SpecrlError, match="open-loop load needs 'rate_per_s', a number > 0"):
            make_trace(name="x", seed=0, n_requests=3, load=load)
    assert len(preset_trace("poisson", n_requests=5, rate_per_s=2.0).requests) == 5


def test_cli_writes_a_replayable_trace(tmp_path):
    from specrl.cli import main

    out = tmp_path / "t.json"
    assert main(["workload", "--preset", "bursts", "--seed", "2", "--out", str(out)]) == 0
    assert load_trace(out).to_json() == preset_trace("bursts", seed=2).to_json()
    # steady-N for any N, as the README says, not only the three listed presets.
    argv = ["workload", "--preset", "steady-16", "--n-requests", "5", "--out", str(out)]
    assert main(argv) == 0
    assert load_trace(out).to_json() == preset_trace("steady-16", n_requests=5).to_json()


def test_cli_refuses_an_unknown_preset_naming_the_choices(tmp_path, capsys):
    from specrl.cli import main

    for name in ("busy", "steady-0", "steady-x"):
        with pytest.raises(SystemExit) as exc:
            main(["workload", "--preset", name, "--out", str(tmp_path / "t.json")])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert f"unknown preset '{name}'" in err and "steady-N for any N" in err
    assert not (tmp_path / "t.json").exists()


def test_version_1_trace_is_read_as_greedy(tmp_path):
    obj = preset_trace("steady-8", seed=0, n_requests=4).to_json()
    obj["version"] = 1
    del obj["sampling"]
    for r in obj["requests"]:
        del r["temperature"], r["top_p"]
    trace = load_trace(_write(tmp_path, obj))
    assert {(r.temperature, r.top_p) for r in trace.requests} == {(0.0, 1.0)}
    assert trace.sampling == {"greedy": 1.0}


def test_requests_carry_the_sampling_mix():
    from specrl.workload import SAMPLING_CONFIGS, temperature_band

    trace = preset_trace("steady-8", seed=3, n_requests=600)
    settings = [(r.temperature, r.top_p) for r in trace.requests]
    assert set(settings) == set(SAMPLING_CONFIGS.values())
    for name, config in SAMPLING_CONFIGS.items():
        share = settings.count(config) / len(settings)
        assert share == pytest.approx(1 / 3, abs=0.06)
        assert trace.sampling[name] == pytest.approx(share)
        assert temperature_band(config[0]) == name
    greedy_only = preset_trace("steady-8", seed=3, n_requests=50, sampling={"greedy": 1.0})
    assert {r.temperature for r in greedy_only.requests} == {0.0}
    with pytest.raises(SpecrlError, match=r"sampling mix.*non-negative weights"):
        preset_trace("steady-8", n_requests=5, sampling={"hot": 1.0})


def test_mixed_preset_shifts_domain_and_sampling_with_the_load():
    """Busy hours (middle of the trace) lean to code and greedy, quiet hours to prose and
    sampling, on the day cycle's load."""
    from specrl.workload import mixed_day

    trace = preset_trace("mixed", seed=0, n_requests=2000, peak=128)
    n = len(trace.requests)
    night = trace.requests[: n // 8] + trace.requests[-n // 8 :]
    noon = trace.requests[3 * n // 8 : 5 * n // 8]

    def share(rs, pred):
        return sum(map(pred, rs)) / len(rs)

    assert (
        share(noon, lambda r: r.domain == "code") > share(night, lambda r: r.domain == "code") + 0.2
    )
    assert (
        share(noon, lambda r: r.temperature == 0) > share(night, lambda r: r.temperature == 0) + 0.2
    )
    assert max(c for _, c in trace.load["schedule"]) == 128
    assert mixed_day(0.5)[0]["code"] == pytest.approx(0.6)
    assert mixed_day(0.0)[1]["greedy"] == pytest.approx(0.15)


@pytest.mark.parametrize("preset", [*PRESETS, "steady-3"])
def test_generated_traces_equal_their_full_round_trip(preset):
    """make_trace checks one request through the file validator and keeps the rest as drawn:
    the trace must equal what validating every request gives."""
    for seed in (0, 1):
        trace = preset_trace(preset, seed=seed)
        again = trace_from_json(json.loads(json.dumps(trace.to_json())))
        assert again.to_json() == trace.to_json() and again.requests == trace.requests


# ---------------------------------------------------------------------- mutation gaps


def test_bursts_start_low_and_alternate_every_half_period():
    from specrl.workload import bursts

    assert bursts(8, low=2, high=6, period=4) == [[0, 2], [2, 6], [4, 2], [6, 6]]


def test_day_cycle_runs_from_night_at_low_to_noon_at_high():
    from specrl.workload import day_cycle

    assert day_cycle(24, low=1, high=9, points=4) == [[0, 1], [6, 5], [12, 9], [18, 5]]


def test_poisson_arrivals_come_at_the_stated_rate():
    trace = preset_trace("poisson", seed=0, n_requests=4000, rate_per_s=4.0)
    arrivals = np.array([r.arrival_s for r in trace.requests])
    assert arrivals[0] > 0 and np.all(np.diff(arrivals) >= 0)
    # Mean gap 1 / 4 s; 4000 exponential gaps give a standard error of 0.004 (5 sigma: 0.02).
    assert arrivals[-1] / 4000 == pytest.approx(0.25, abs=0.02)


def test_peak_caps_a_steady_preset():
    trace = preset_trace("steady-64", seed=0, peak=8)
    assert trace.load["schedule"] == [[0, 8]]
    assert len(trace.requests) == 32


def test_temperature_bands_go_to_the_nearest_setting():
    from specrl.workload import temperature_band

    expected = {0.0: "greedy", 0.05: "chat", 0.8: "chat", 0.9: "default", 1.0: "default"}
    assert {t: temperature_band(t) for t in expected} == expected


def test_offsets_cover_the_whole_stream():
    trace = make_trace(
        name="t",
        seed=0,
        n_requests=500,
        load={"kind": "closed", "schedule": [[0, 1]]},
        stream_len=100,
    )
    offsets = {r.offset for r in trace.requests}
    # Uniform over 0..99: 500 draws miss a given offset with probability 0.0066.
    assert offsets <= set(range(100)) and max(offsets) >= 90


def test_a_length_distribution_needs_lo_at_most_hi():
    with pytest.raises(SpecrlError, match="1 <= lo <= hi"):
        LengthDist(median=10, sigma=0.0, lo=20, hi=5)


@pytest.mark.parametrize(
    ("preset", "edit", "message"),
    [
        (
            "poisson",
            lambda t: t["requests"][2].update(arrival_s=t["requests"][1]["arrival_s"] - 0.01),
            r"requests\[2\]\.arrival_s: arrivals must not decrease",
        ),
        (
            "steady-8",
            lambda t: t["load"].update(schedule=[[0, 2], [2, 0]]),
            r"load\.schedule\[1\]: expected \[completed, concurrency\]",
        ),
        (
            "steady-8",
            lambda t: t["output_lengths"].update(lo=20, hi=10),
            r"output_lengths: .*1 <= lo <= hi",
        ),
    ],
)
def test_malformed_trace_gaps_are_rejected(tmp_path, preset, edit, message):
    obj = preset_trace(preset, seed=0, n_requests=4).to_json()
    edit(obj)
    with pytest.raises(SpecrlError, match=message):
        load_trace(_write(tmp_path, obj))


@pytest.mark.parametrize("peak", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("name", ["steady-64", "ramp", "bursts", "day", "mixed"])
def test_peak_caps_the_concurrency_of_every_closed_loop_preset(name, peak):
    # bursts held 2 requests at peak 1: an env with max_batch 1 always had one queued.
    trace = preset_trace(name, seed=0, peak=peak)
    assert trace.load["kind"] == "closed"
    assert max(c for _, c in trace.load["schedule"]) <= peak
