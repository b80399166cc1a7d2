"""Every section's values against the shards read with safetensors.numpy, both layouts."""

import numpy as np
import pytest
import shardify

PACKED = ["event_id", "event_azimuth", "event_zenith", "event_dom_offsets",
          "dom_pulse_offsets", "dom_sensor_id", "dom_position", "pulse_time",
          "pulse_charge", "pulse_auxiliary"]


def test_dataset_attributes(train_dir, stored):
    ds = shardify.Dataset(train_dir, checksums="full")
    assert len(ds) == ds.events == 300
    assert ds.doms == sum(len(s["dom_sensor_id"]) for s in stored.shards)
    assert ds.pulses == sum(len(s["pulse_time"]) for s in stored.shards)
    assert ds.labels
    assert ds.manifest["format_version"] == 2
    assert ds.manifest["totals"]["events"] == 300
    assert ds.geometry.dtype == stored.positions.dtype
    np.testing.assert_array_equal(ds.geometry, stored.positions)


@pytest.mark.parametrize("output", ["torch", "numpy"])
def test_packed_sections_equal_the_shards(train_dir, stored, torch, output):
    loader = shardify.Loader(train_dir, batch_events=24, output=output, seed=9)
    assert loader.section_names == tuple(PACKED)
    seen = 0
    for batch in loader:
        b = {k: np.asarray(v) for k, v in batch.items()}
        assert list(b) == PACKED
        assert b["pulse_auxiliary"].dtype == np.bool_
        ev, dp = b["event_dom_offsets"], b["dom_pulse_offsets"]
        assert ev[0] == 0 and dp[0] == 0
        assert ev[-1] == len(b["dom_sensor_id"]) and dp[-1] == len(b["pulse_time"])
        for k, event_id in enumerate(b["event_id"]):
            want = stored.event(int(event_id))
            doms = slice(ev[k], ev[k + 1])
            pulses = slice(dp[ev[k]], dp[ev[k + 1]])
            for name in ("dom_sensor_id", "pulse_time", "pulse_charge", "pulse_auxiliary"):
                got = b[name][doms] if name == "dom_sensor_id" else b[name][pulses]
                assert got.dtype == want[name].dtype, name
                np.testing.assert_array_equal(got, want[name], err_msg=name)
            np.testing.assert_array_equal(np.diff(dp[doms.start:doms.stop + 1]),
                                          want["dom_pulse_counts"])
            np.testing.assert_array_equal(b["dom_position"][doms],
                                          stored.positions[want["dom_sensor_id"]])
            assert b["event_azimuth"][k] == want["event_azimuth"]
            assert b["event_zenith"][k] == want["event_zenith"]
            seen += 1
    assert seen == 300


def test_padded_sections_equal_the_shards(train_dir, stored, torch):
    max_doms, k_pulses = 20, 3
    loader = shardify.Loader(train_dir, batch_events=32, layout="padded", max_doms=max_doms,
                             pulses_per_dom=k_pulses)
    assert loader.section_names == ("event_id", "event_azimuth", "event_zenith",
                                    "dom_features", "dom_mask")
    seen = 0
    for batch in loader:
        features = batch["dom_features"].numpy()
        mask = batch["dom_mask"].numpy()
        assert features.dtype == np.float32 and mask.dtype == np.uint8
        assert features.shape[2] == 4 + 3 * k_pulses
        for row, event_id in enumerate(batch["event_id"].tolist()):
            want = stored.event(event_id)
            n = min(len(want["dom_sensor_id"]), max_doms)
            assert mask[row].tolist() == [1] * n + [0] * (features.shape[1] - n)
            assert not features[row, n:].any(), "padding is zero"
            starts = np.concatenate([[0], np.cumsum(want["dom_pulse_counts"])])
            for d in range(n):
                f = features[row, d]
                np.testing.assert_array_equal(
                    f[:3], stored.positions[want["dom_sensor_id"][d]].astype(np.float32))
                count = want["dom_pulse_counts"][d]
                assert f[3] == count
                kept = min(count, k_pulses)
                first = slice(starts[d], starts[d] + kept)
                triples = f[4:4 + 3 * kept].reshape(kept, 3)
                np.testing.assert_array_equal(triples[:, 0],
                                              want["pulse_time"][first].astype(np.float32))
                np.testing.assert_array_equal(triples[:, 1],
                                              want["pulse_charge"][first].astype(np.float32))
                np.testing.assert_array_equal(triples[:, 2],
                                              want["pulse_auxiliary"][first].astype(np.float32))
                assert not f[4 + 3 * kept:].any()
            seen += 1
    assert seen == 300


def test_test_split_has_no_label_sections(test_dir, torch):
    ds = shardify.Dataset(test_dir)
    assert not ds.labels
    loader = shardify.Loader(ds, batch_events=50)
    batches = list(loader)
    assert sum(len(b["event_id"]) for b in batches) == len(ds)
    for b in batches:
        assert "event_azimuth" not in b and "event_zenith" not in b
        assert list(b) == list(loader.section_names), "each key names its own section"
    padded = next(iter(shardify.Loader(ds, batch_events=50, layout="padded", max_doms=8,
                                       pulses_per_dom=2)))
    assert list(padded) == ["event_id", "dom_features", "dom_mask"]


def test_dom_positions_can_be_left_out(train_dir, torch):
    batch = next(iter(shardify.Loader(train_dir, batch_events=8, dom_positions=False)))
    assert "dom_position" not in batch and "dom_sensor_id" in batch
