"""The NIC ports' state as one table of arrays (issue 31, ``models.telemetry.NicTable``):
the same numbers, bit for bit, as a ``Device`` per port updated sample by sample (the
reference arithmetic), whichever form the samples came in (``nic`` events, ``nic_batch``es,
both mixed, a port twice in a batch) and however they were held back; counters up to the
64-bit limit; the ports listed in the order they were first sampled."""

from __future__ import annotations

import pickle
import random

from failslow.models.config import DetectorConfig
from failslow.models.telemetry import NIC_COUNTERS, Device, TelemetryStore
from failslow.schema.batches import to_batch

T0 = 1.7e9
BIG = 2**63 - 1


def _samples(rng: random.Random, rounds: int) -> list[list[dict]]:
    """Rounds of samples of two hosts' ports: counters that grow, reset, stay, jump near
    the 64-bit limit or go missing; speed and state that change."""
    last: dict = {}
    out = []
    for k in range(rounds):
        rnd = []
        for h in ("h0", "h1"):
            for nic in ("mlx5_0", "mlx5_1", "mlx5_2"):
                if h == "h1" and nic == "mlx5_2" and k < rounds // 2:
                    continue                        # a port first seen mid-way
                ev = {"v": 1, "kind": "nic", "ts": T0 + k + rng.choice((0.0, 0.25, 0.5)),
                      "host": h, "nic": nic, "port": 1, "tx_bytes_total": 10 * k,
                      "rx_bytes_total": 20 * k}
                if rng.random() < 0.8:
                    ev["speed_gbps"] = rng.choice((400.0, 400.0, 200.0, 100))
                ev["state"] = rng.choice(("up", "up", "down"))
                for name in NIC_COUNTERS:
                    prev = last.get((h, nic, name), 0)
                    how = rng.random()
                    if how < 0.1:
                        continue                    # missing from this sample
                    x = (rng.randrange(2) if how < 0.2 else     # a reset
                         prev if how < 0.5 else
                         BIG - rng.randrange(1000) if how < 0.6 else
                         prev + rng.randrange(1, 10**6))
                    x = min(x, BIG)
                    last[(h, nic, name)] = x
                    ev[name] = x
                rnd.append(ev)
        out.append(rnd)
    return out


def _reference(rounds: list[list[dict]], p: DetectorConfig) -> dict:
    devs: dict = {}
    for rnd in rounds:
        for ev in rnd:
            d = devs.setdefault((ev["host"], ev["nic"], ev["port"]), Device())
            d.observe(ev, ("speed_gbps",), NIC_COUNTERS, p)
            d.down = ev.get("state") == "down"
    return devs


def _state(nics: dict) -> list:
    return [(k, d.gauges, d.first, d.rates, d.last, d.down, d.last_ts, d.n)
            for k, d in nics.items()]


def test_the_table_holds_the_reference_numbers_bit_for_bit():
    rng = random.Random(7)
    p = DetectorConfig()
    for trial in range(4):
        rounds = _samples(rng, 12)
        ref = _state(_reference(rounds, p))
        for form in ("events", "batches", "mixed"):
            st = TelemetryStore(p)
            for k, rnd in enumerate(rounds):
                for h in ("h0", "h1"):
                    rows = [e for e in rnd if e["host"] == h]
                    if form == "events" or (form == "mixed" and k % 2):
                        for e in rows:
                            st.observe_nic(e)
                    else:
                        st.observe_nic_batch(to_batch(rows))
                if rng.random() < 0.3:
                    assert st.nics                  # read: the held samples applied
            got = _state(st.nics)
            # speed: the table keeps floats (a gauge given as an integer reads as a float)
            assert [g[0] for g in got] == [r[0] for r in ref]
            for g, r in zip(got, ref, strict=True):
                assert g == r, (trial, form, g[0])
                assert all(type(x) is int for x in g[4].values())     # counters: integers
                assert {k: repr(x) for k, x in g[3].items()} == {
                    k: repr(x) for k, x in r[3].items()}              # the same floats


def test_a_port_twice_in_one_batch_takes_its_rows_in_order():
    rows = [{"v": 1, "kind": "nic", "ts": T0 + i, "host": "h0", "nic": "mlx5_0", "port": 1,
             "tx_bytes_total": 1, "rx_bytes_total": 1, "rx_drops_total": 5 * i * i}
            for i in range(3)]
    st = TelemetryStore()
    st.observe_nic_batch(to_batch(rows))
    ref = _reference([rows], st.p)
    assert _state(st.nics) == _state(ref)
    assert st.nics[("h0", "mlx5_0", 1)].n == 3


def test_held_samples_survive_a_snapshot_and_forgotten_ports_start_afresh():
    rng = random.Random(3)
    rounds = _samples(rng, 6)
    st = TelemetryStore()
    for rnd in rounds[:3]:
        for e in rnd:
            st.observe_nic(e)
    st = pickle.loads(pickle.dumps(st))          # held samples applied before pickling
    for rnd in rounds[3:]:
        st.observe_nic_batch(to_batch([e for e in rnd if e["host"] == "h0"]))
        for e in rnd:
            if e["host"] == "h1":
                st.observe_nic(e)
    ref = _reference(rounds, st.p)
    assert sorted(_state(st.nics)) == sorted(_state(ref))
    assert st.forget(T0 + 100, {"h0"}) == 3      # h1's ports
    assert {k[0] for k in st.nics} == {"h0"}
    st.nics = {k: d for k, d in st.nics.items() if k[1] != "mlx5_1"}
    assert sorted(k[1] for k in st.nics) == ["mlx5_0", "mlx5_2"]
    assert all(d.n == 6 for d in st.nics.values())


def test_ports_dropped_and_sampled_again_by_the_same_batches_start_afresh():
    # flush_nics keeps each host's port keys from its last batch (issue 31): a batch like
    # the last one after its ports were dropped makes their rows again
    rounds = _samples(random.Random(5), 8)
    st = TelemetryStore()
    for k, rnd in enumerate(rounds):
        if k == 4:
            st.nics = {key: d for key, d in st.nics.items() if key[0] != "h1"}
            assert {key[0] for key in st.nics} == {"h0"}
        for h in ("h0", "h1"):
            st.observe_nic_batch(to_batch([e for e in rnd if e["host"] == h]))
        assert st.nics
    ref = _reference([[e for e in rnd if e["host"] == "h0" or k >= 4]
                      for k, rnd in enumerate(rounds)], st.p)
    assert sorted(_state(st.nics)) == sorted(_state(ref))
    # new ports take their rows in the order first sampled, a batch like the host's last
    # one among them once its ports were dropped
    st.nics = {key: d for key, d in st.nics.items() if key[0] != "h1"}
    last = rounds[-1]
    h1 = [dict(e, ts=e["ts"] + 10) for e in last if e["host"] == "h1"]
    h0 = [dict(e, ts=e["ts"] + 10) for e in last if e["host"] == "h0"]
    h0.append(dict(h0[0], nic="mlx5_9"))
    st.observe_nic_batch(to_batch(h1))
    st.observe_nic_batch(to_batch(h0))
    new = [key for key in st.nics if key[0] == "h1" or key[1] == "mlx5_9"]
    assert new == [(e["host"], e["nic"], e["port"]) for e in h1] + [("h0", "mlx5_9", 1)]
    assert sorted(st.nic_table.rows.values()) == list(range(len(st.nics)))


def test_the_readers_accessor_reads_what_the_ports_views_read():
    from failslow.models.links import _OUTLIER_NAMES, outlier_nics

    rng = random.Random(11)
    st = TelemetryStore()
    for rnd in _samples(rng, 8):
        for e in rnd:
            st.observe_nic(e)
    st.observe_nic_batch(to_batch([dict(e, ts=T0 + 20, rx_drops_total=10**12)
                                   for e in _samples(random.Random(1), 1)[0]
                                   if e["host"] == "h1"]))
    keys = [k for k in st.nics if k[1] != "mlx5_1"]
    got = st.nic_rates(keys, _OUTLIER_NAMES)
    assert got.tolist() == [[st.nics[k].rates.get(n, 0.0) for k in keys] for n in _OUTLIER_NAMES]
    nics = dict(st.nics)
    assert outlier_nics(nics, None, st) == outlier_nics(nics)
