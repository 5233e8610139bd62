"""The per-request estimate on a serving stack: :class:`specrl.posterior.RequestTracker`, read
from a table's ``request_acceptance`` block, against the environments' posterior, and the
:class:`~specrl.controller.LookupController` that computes it beside a live engine."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
from test_request_acceptance import _live, _micro_profile
from test_table import PROVENANCE, plain_json

from specrl.controller import LookupController
from specrl.envs.base import ACCEPTANCE
from specrl.envs.request_acceptance import acceptance_logits, profile_groups, request_block
from specrl.envs.surrogate import default_profile_path
from specrl.errors import SpecrlError
from specrl.features import conditional_acceptance, temperature_band
from specrl.posterior import RequestTracker
from specrl.profile import load_profile
from specrl.table import table_from_json
from specrl.table.build import table_from_policy


@pytest.fixture(scope="module")
def shipped():
    return load_profile(default_profile_path())


def per_request_table(profile, k_max: int, estimate: str = "usable", edges=(0.0, 0.5, 0.8, 1.0)):
    """A table on a per-request estimate: K rises with the acceptance bin."""
    return table_from_policy(
        lambda b, a, c: min(k_max, int(a * 5)),
        k_max=k_max,
        max_batch=8,
        acceptance_edges=list(edges),
        provenance={**copy.deepcopy(PROVENANCE), "acceptance_estimate": estimate},
        request_acceptance=request_block(profile, k_max),
    )


class LegacyPosterior:
    """The estimate from scratch, request by request: each request's runs kept as observed,
    its candidates' likelihoods multiplied out at the profile's per-token logits (no bucket
    tables), each domain of its band alike and its levels alike within it."""

    def __init__(self, per_token, groups, k_max: int):
        (self.logits, self.levels), self.groups, self.k_max = per_token, groups, k_max
        self.runs: dict[int, list] = {}

    def start(self, requests: int) -> None:
        self.runs = {}

    def admit(self, index: int, group: int) -> None:
        self.runs[index] = []

    def curve(self, index, group: int, generated: int) -> np.ndarray:
        band = self.groups[group][1]
        members = [h for h, (_, b) in enumerate(self.groups) if b == band]
        h = np.concatenate([np.full(len(self.levels[m]), m) for m in members])
        level = np.concatenate([self.levels[m] for m in members])
        weight = np.concatenate(
            [np.full(len(self.levels[m]), 1 / len(self.levels[m])) for m in members]
        )

        def rates(at):
            return 1 / (1 + np.exp(-(self.logits[h, at, : self.k_max] + level[:, None])))

        for at, accepted, drafted in self.runs.get(index, []):
            r = rates(at)
            weight = weight * np.prod(r[:, :accepted], axis=1)
            if accepted < drafted:
                weight = weight * (1 - r[:, accepted])
        return (weight / weight.sum()) @ np.cumprod(rates(generated), axis=1)

    def observe(self, index, group, generated, accepted, drafted) -> None:
        for i, g, a, d in zip(index, generated, accepted, drafted):
            if d > 0:
                self.runs[int(i)].append((int(g), int(a), int(d)))

    def estimate(self, index, group, generated, incoming, left=None):
        curves = [self.curve(int(i), int(g), int(n)) for i, g, n in zip(index, group, generated)]
        curves += [self.curve(None, int(g), 1) for g in incoming]
        if not curves:
            return None
        curves = np.array(curves)
        if left is not None:
            lefts = np.concatenate(left)
            curves = curves * (np.arange(self.k_max) < (lefts - 1)[:, None])
        return conditional_acceptance(float(curves.mean(axis=0).sum()) / self.k_max, self.k_max)


@pytest.mark.parametrize("usable", [False, True])
def test_the_tracker_is_the_envs_posterior_keyed_by_request_id(shipped, usable):
    """Requests of every band arrive, run, draft fewer than K near their end, finish and free
    their slots for later ids; past the profile's last bucket of tokens generated too. At every
    step the tracker's figure, keyed by string ids and read from the exported block, equals
    the posterior worked out from scratch per request over the profile's per-token logits,
    each request in a group of a domain drawn at random (only its band counts)."""
    k_max, rng = 4, random.Random(7)
    tracker = RequestTracker(request_block(shipped, k_max), k_max, usable=usable)
    groups = profile_groups(shipped)
    reference = LegacyPosterior(acceptance_logits(shipped, groups, 400, k_max), groups, k_max)
    reference.start(80)
    held: dict[int, list] = {}  # index: [group, generated, max_tokens]
    waiting: list[int] = []
    arrived, compared = 0, 0
    while arrived < 80 or held or waiting:
        for _ in range(rng.random() < 0.25):
            if arrived < 80:
                temperature = rng.choice([0.0, 0.7, 1.0])
                max_tokens = rng.choice([1, 2, 3, rng.randint(4, 300)])
                band = temperature_band(temperature)
                group = rng.choice([i for i, (_, b) in enumerate(groups) if b == band])
                tracker.add(f"r{arrived}", temperature=temperature, max_tokens=max_tokens)
                reference.admit(arrived, group)
                held[arrived] = [group, 0, max_tokens]
                waiting.append(arrived)
                arrived += 1
        incoming = waiting[: max(0, 12 - sum(held[i][1] > 0 for i in held))]
        running = [i for i in held if held[i][1] > 0]
        decoded = [i for i in incoming if held[i][2] > 1]
        left = None
        if usable:
            left = (
                np.array([held[i][2] - held[i][1] for i in running]),
                np.array([held[i][2] - 1 for i in decoded]),
            )
        expected = reference.estimate(
            np.array(running, dtype=np.int64),
            np.array([held[i][0] for i in running], dtype=np.int64),
            np.array([min(held[i][1], 400) for i in running], dtype=np.int64),
            np.array([held[i][0] for i in decoded], dtype=np.int64),
            left,
        )
        got = tracker.estimate(
            [(f"r{i}", held[i][1]) for i in running], [f"r{i}" for i in incoming]
        )
        if expected is None:
            assert got is None
        else:
            assert got == pytest.approx(expected, rel=1e-9)
            compared += 1
        k = rng.choice([0, 2, 4])
        runs = []
        for i in running:
            drafted = min(k, held[i][2] - held[i][1] - 1)
            runs.append((i, held[i][1], drafted, rng.randint(0, drafted) if drafted > 0 else 0))
        if runs:
            ids, generated, drafted, accepted = (np.array(x) for x in zip(*runs))
            reference.observe(
                ids, np.array([held[i][0] for i in ids]), generated, accepted, drafted
            )
            tracker.observe([f"r{i}" for i in ids], generated, drafted, accepted)
        for i, _, _, a in runs:
            held[i][1] += a + 1
        for i in incoming:
            waiting.remove(i)
            held[i][1] = 1
        for i in [i for i in held if held[i][1] >= held[i][2]]:
            del held[i]
            tracker.finish(f"r{i}")
    assert compared > 100 and len(tracker) == 0
    assert tracker._posterior.capacity < 80  # finished requests' slots were reused


def test_the_controller_computes_the_live_envs_figure_beside_the_engine(micro_pair):
    """A serving loop around the live engine: each request added as it arrives (its
    temperature and max tokens), the coming step's rows and admissions passed to
    ``choose_k``, each row's run to ``requests.observe``, finished requests freed. At every
    step of a live episode the controller's figure is the env's observation, and its K the
    table's at that figure."""
    profile = _micro_profile(micro_pair)
    env = _live(micro_pair, profile, acceptance_estimate="usable")
    table = per_request_table(profile, 3)
    controller = LookupController(table)
    obs, _ = env.reset(seed=5)
    ks, step, done, seen, added = [3, 1, 0, 2, 3, 3, 0], 0, False, set(), set()
    while not done:
        engine = env.engine
        running, waiting = engine.running_rows(), engine.waiting_rows()
        for rid, _ in [*running, *waiting]:
            if rid not in added:
                r = env.trace.requests[env._trace_index[rid]]
                controller.requests.add(rid, temperature=r.temperature, max_tokens=r.max_new_tokens)
                added.add(rid)
        free = env.max_batch - len(running)
        k = controller.choose_k(
            len(running) + len(waiting[:free]),
            rows=running,
            incoming=[r for r, _ in waiting[:free]],
        )
        assert controller.tracker.estimate == pytest.approx(float(obs[ACCEPTANCE]), rel=1e-5)
        assert k == table.cell(0)[table.acceptance_bin(controller.tracker.estimate)]
        seen.add(round(controller.tracker.estimate, 4))
        live = {rid for rid, _ in [*running, *waiting]}
        obs, _, done, _, _ = env.step(ks[step % len(ks)])
        stats = env.last_stats
        if stats.drafted:
            controller.requests.observe(
                stats.row_request_ids, stats.row_generated, stats.row_drafted, stats.row_accepted
            )
        now = {rid for rid, _ in [*env.engine.running_rows(), *env.engine.waiting_rows()]}
        for rid in live - now:
            controller.requests.finish(rid)
            added.discard(rid)
        step += 1
    assert len(seen) > 5 and step > 10


def test_the_tracker_refuses_what_it_cannot_read(shipped):
    tracker = RequestTracker(request_block(shipped, 4), 4, usable=True)
    tracker.add("a", temperature=0.0, max_tokens=10)
    with pytest.raises(SpecrlError, match="request 'a' was added already"):
        tracker.add("a", temperature=0.0, max_tokens=10)
    with pytest.raises(SpecrlError, match="max_tokens must be an integer >= 1, got 2.5"):
        tracker.add("b", temperature=0.0, max_tokens=2.5)
    with pytest.raises(SpecrlError, match="max_tokens must be >= 1, got 0"):
        tracker.add("b", temperature=0.0, max_tokens=0)
    with pytest.raises(SpecrlError, match=r"requests.estimate: request 'z' is not held"):
        tracker.estimate([("z", 3)])
    with pytest.raises(SpecrlError, match=r"requests.finish: request 'z' is not held"):
        tracker.finish("z")
    with pytest.raises(SpecrlError, match="one entry per row, got 1, 2, 1 and 1"):
        tracker.observe(["a"], [1, 2], [2], [1])
    with pytest.raises(SpecrlError, match="0 <= accepted <= drafted"):
        tracker.observe(["a"], [1], [2], [3])
    greedy = request_block(shipped, 4)
    greedy["groups"] = [g for g in greedy["groups"] if g["band"] == "greedy"]
    only = RequestTracker(greedy, 4, usable=False)
    with pytest.raises(
        SpecrlError, match=r"temperature 0.7 \(band 'chat'\).*only the bands \['greedy'\]"
    ):
        only.add("c", temperature=0.7, max_tokens=5)
    assert only.estimate([]) is None


def test_a_steps_table_refuses_rows_and_a_per_request_table_refuses_batch_totals(shipped):
    steps = LookupController(table_from_json(plain_json()))
    assert steps.requests is None
    with pytest.raises(SpecrlError, match="rows= feeds the per-request acceptance estimate"):
        steps.choose_k(2, rows=[("a", 3)])
    controller = LookupController(per_request_table(shipped, 4, "requests"))
    assert not controller.requests.usable
    with pytest.raises(SpecrlError, match=r"controller.requests.observe\(request_ids"):
        controller.observe(4, 2)
    controller.requests.add("a", temperature=0.0, max_tokens=50)
    controller.choose_k(1, rows=[("a", 3)])
    assert controller.tracker.since_measured == 0
    controller.reset()
    assert len(controller.requests) == 0
    # Named, the estimate is the caller's (an env's observation): nothing is built to compute
    # it, and neither rows nor batch totals are taken.
    fed = LookupController(
        per_request_table(shipped, 4, "requests"), acceptance_estimate="requests"
    )
    assert fed.requests is None
    with pytest.raises(SpecrlError, match="reads the figure its caller sets on tracker"):
        fed.choose_k(1, rows=[("a", 3)])
    with pytest.raises(SpecrlError, match=r"controller.requests.observe\(request_ids"):
        fed.observe(4, 2)


def test_the_temperature_bands_are_the_workloads_sampling_configs():
    from specrl.features import TEMPERATURE_BANDS
    from specrl.workload import SAMPLING_CONFIGS

    assert tuple(SAMPLING_CONFIGS) == TEMPERATURE_BANDS
    assert [temperature_band(t) for t, _ in SAMPLING_CONFIGS.values()] == list(TEMPERATURE_BANDS)


def test_the_table_file_round_trips_the_block_and_rejects_a_malformed_one(shipped, tmp_path):
    table = per_request_table(shipped, 4)
    path = tmp_path / "t.json"
    table.save(path)
    text = path.read_text()
    assert text.count('{"domain": ') == len(table.request_acceptance["groups"])  # one per line
    again = LookupController.load(path)
    assert again.table.request_acceptance == table.request_acceptance
    good = table.to_json()
    cases = [
        (lambda o: o["request_acceptance"].pop("groups"), r"expected \{\"generated_edges\""),
        (
            lambda o: o["request_acceptance"].update(generated_edges=[16, 16]),
            r"generated_edges\[1\]: expected an integer 17",
        ),
        (
            lambda o: o["request_acceptance"].update(groups=[]),
            "groups: expected at least one group",
        ),
        (
            lambda o: o["request_acceptance"]["groups"][0].update(band="warm"),
            r"groups\[0\].band: expected one of greedy, chat, default",
        ),
        (
            lambda o: o["request_acceptance"]["groups"][1].update(domain="code", band="greedy"),
            r"groups\[1\]: \('code', 'greedy'\) appears twice",
        ),
        (
            lambda o: o["request_acceptance"]["groups"][0].update(levels=[]),
            r"groups\[0\].levels: expected a non-empty list",
        ),
        (
            lambda o: o["request_acceptance"]["groups"][0]["logits"].pop(),
            r"groups\[0\].logits: expected a list of 5, got a list of 4",
        ),
        (
            lambda o: o["request_acceptance"]["groups"][2]["logits"][1].append(0.0),
            r"groups\[2\].logits\[1\]: expected a list of 4",
        ),
        (
            lambda o: o["request_acceptance"]["groups"][0]["logits"][0].__setitem__(0, "x"),
            r"groups\[0\].logits\[0\]: expected 4 finite numbers",
        ),
        (
            lambda o: o["provenance"].pop("acceptance_estimate"),
            "read only by a table on a per-request estimate",
        ),
    ]
    for damage, message in cases:
        obj = copy.deepcopy(good)
        damage(obj)
        with pytest.raises(SpecrlError, match=message):
            table_from_json(obj)


def test_the_figure_is_computed_only_where_the_tables_k_depends_on_it(shipped):
    """Where every acceptance bin of a batch size holds one K, ``choose_k`` does not compute
    the per-request figure (it could not change the K). Its K is still the table's at the
    figure a tracker fed the same runs computes at every step, the figure stays fresh (never
    the stale K), and a request never added is refused there too."""
    edges = [0.0, 0.5, 0.8, 1.0]
    table = table_from_policy(
        lambda b, a, c: min(4, int(a * 5)) if b <= 4 else 0,  # one K above 4 rows
        k_max=4,
        max_batch=8,
        acceptance_edges=edges,
        provenance={**copy.deepcopy(PROVENANCE), "acceptance_estimate": "usable"},
        request_acceptance=request_block(shipped, 4),
    )
    controller = LookupController(table)
    reference = RequestTracker(table.request_acceptance, 4, usable=True)
    calls = []
    computed = controller.requests.estimate
    controller.requests.estimate = lambda *a, **kw: calls.append(len(a[0])) or computed(*a, **kw)
    rng = random.Random(7)
    generated: dict[int, int] = {}
    for rid in range(12):
        temperature = rng.choice([0.0, 0.7])
        for tracker in (controller.requests, reference):
            tracker.add(rid, temperature=temperature, max_tokens=40)
        generated[rid] = 1
    flat = sloped = 0
    for _ in range(200):
        batch = rng.randint(1, 8)
        rows = [(rid, generated[rid]) for rid in rng.sample(sorted(generated), batch)]
        before = len(calls)
        k = controller.choose_k(batch, rows=rows)
        figure = reference.estimate(rows)
        assert table.batch_buckets == [[1, 4], [5, 8]]
        assert k == table.cell(int(batch > 4))[table.acceptance_bin(figure)]
        assert controller.tracker.since_measured == 0
        if batch > 4:
            assert len(calls) == before  # one K: not computed
            flat += 1
        else:
            assert len(calls) == before + 1
            sloped += 1
        ids = [rid for rid, _ in rows]
        drafted = [k] * batch
        accepted = [rng.randint(0, k) for _ in rows]
        before_step = [generated[rid] for rid in ids]
        for tracker in (controller.requests, reference):
            tracker.observe(ids, before_step, drafted, accepted)
        for rid, a in zip(ids, accepted):
            generated[rid] = min(generated[rid] + a + 1, 30)
    assert flat > 50 and sloped > 50
    for batch in (6, 0):  # the rows are checked where the figure is not computed too
        with pytest.raises(SpecrlError, match=r"requests.estimate: request 'z' is not held"):
            controller.choose_k(batch, rows=[("z", 3)])
    with pytest.raises(ValueError):
        controller.choose_k(6, rows=[(0, "x")])
