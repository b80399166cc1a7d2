"""On a CUDA device (skipped, saying so, without one): the device epoch equals the CPU
epoch, torch work queued on its current stream sees complete batches, and device tensors
made through torch's DLPack C exchange API equal those from its capsules; resident batches
(fused and torch gathers) equal the streaming ones, and a resident epoch runs under
``torch.cuda.set_sync_debug_mode("error")``."""

import pytest
import shardify
from conftest import assert_same_batches


@pytest.fixture(scope="module")
def cuda(torch):
    if not torch.cuda.is_available():
        pytest.skip("SKIPPED: no CUDA device or driver here; the GPU path runs on a GPU machine")
    return torch.device("cuda:0")


def host_epoch(train_dir):
    return [{k: v.clone() for k, v in b.items()}
            for b in shardify.Loader(train_dir, batch_events=16, device="cpu")]


def test_a_device_epoch_equals_the_cpu_epoch(train_dir, torch, cuda):
    loader = shardify.Loader(train_dir, batch_events=16, device=cuda)
    assert loader.device == cuda
    device_batches = []
    for batch in loader:
        on_host = [name for name, t in batch.items() if t.device != cuda]
        assert not on_host, f"sections not on {cuda}: {on_host}"
        device_batches.append({k: v.cpu() for k, v in batch.items()})
    expected = host_epoch(train_dir)
    assert len(device_batches) == len(expected)
    for got, want in zip(device_batches, expected, strict=True):
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), name


def test_auto_and_cuda_follow_torchs_current_device(train_dir, torch, cuda):
    last = torch.cuda.device_count() - 1  # device 0 on a one-GPU machine
    previous = torch.cuda.current_device()
    torch.cuda.set_device(last)
    try:
        expected = torch.device("cuda", last)
        for device in ("auto", "cuda", torch.device("cuda")):
            loader = shardify.Loader(train_dir, batch_events=16, device=device)
            assert loader.device == expected, device
            assert next(iter(loader))["pulse_time"].device == expected
        resident = shardify.Loader(train_dir, batch_events=16, resident=True)
        assert resident.device == expected
        assert next(iter(resident))["pulse_time"].device == expected
    finally:
        torch.cuda.set_device(previous)


def test_work_on_the_current_stream_sees_complete_batches(train_dir, torch, cuda):
    expected = [float(b["pulse_charge"].double().sum()) for b in host_epoch(train_dir)]
    stream = torch.cuda.Stream(cuda)
    sums = []
    with torch.cuda.stream(stream):
        for batch in shardify.Loader(train_dir, batch_events=16, device=cuda, prefetch=8):
            # Queued at once on the current (non-default) stream, read after the epoch:
            # only the stream's wait on the copy makes these right.
            sums.append(batch["pulse_charge"].double().sum())
            del batch
    torch.cuda.synchronize()
    assert [float(s) for s in sums] == expected


def test_device_tensors_through_the_exchange_equal_the_capsules(train_dir, torch, cuda):
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip(f"torch {torch.__version__} has no DLPack C exchange API")
    settings = dict(batch_events=16, device=cuda, seed=5)
    via_capsules = shardify.Loader(train_dir, **settings)._native
    via_exchange = shardify.Loader(train_dir, **settings)._native
    convert = torch._C._from_dlpack
    stream = torch.cuda.current_stream(cuda).cuda_stream or 1
    batches = 0
    while (a := via_capsules.next_batch_dict(convert, stream)) is not None:
        b = via_exchange.next_batch_dict(convert, stream, torch.Tensor)
        assert b is not None
        assert all(t.device == cuda for t in b.values()), [t.device for t in b.values()]
        assert_same_batches([a], [b], torch)
        batches += 1
    assert via_exchange.next_batch_dict(convert, stream, torch.Tensor) is None
    assert batches == -(-300 // 16)


RESIDENT_SETTINGS = [dict(batch_events=16, seed=3),
                     dict(max_pulses=900, window_blocks=1 << 20, batch_order="drawn"),
                     dict(batch_events=16, layout="padded", max_doms=20, pulses_per_dom=3)]


@pytest.mark.parametrize("gather", ["fused", "torch"])
@pytest.mark.parametrize("settings", RESIDENT_SETTINGS)
def test_resident_batches_on_the_gpu_equal_streaming_ones(train_dir, torch, cuda, monkeypatch,
                                                          gather, settings):
    if gather == "fused":
        pytest.importorskip("triton")
    monkeypatch.setenv("SHARDIFY_RESIDENT_GATHER", gather)
    expected = [{k: v.clone() for k, v in b.items()}
                for b in shardify.Loader(train_dir, device="cpu", **settings)]
    loader = shardify.Loader(train_dir, device=cuda, resident=True, **settings)
    assert loader._batches.gather_kind == gather
    got = [{k: v.cpu() for k, v in b.items()} for b in loader]
    assert_same_batches(expected, got, torch)


@pytest.mark.parametrize("gather", ["fused", "torch"])
def test_a_resident_epoch_never_synchronises(train_dir, torch, cuda, monkeypatch, gather):
    if gather == "fused":
        pytest.importorskip("triton")
    monkeypatch.setenv("SHARDIFY_RESIDENT_GATHER", gather)
    expected = [float(b["pulse_charge"].double().sum())
                for b in shardify.Loader(train_dir, device="cpu", batch_events=16, seed=1)]
    for settings in (dict(), dict(layout="padded", max_doms=20, pulses_per_dom=3)):
        loader = shardify.Loader(train_dir, device=cuda, resident=True, batch_events=16, seed=1,
                                 **settings)
        for _ in loader:  # epoch 0: Triton compiles its kernels
            pass
        loader.set_epoch(0)
        sums = []
        torch.cuda.set_sync_debug_mode("error")
        try:
            for batch in loader:  # the plan's upload and every batch: nothing waits
                name = "pulse_charge" if "pulse_charge" in batch else "dom_features"
                sums.append(batch[name].double().sum())
        finally:
            torch.cuda.set_sync_debug_mode(0)
        if "pulse_charge" in loader.section_names:
            assert [float(s) for s in sums] == expected
        assert len(sums) == len(expected)


def test_the_adapters_on_the_gpu_equal_the_cpu_ones(realistic_dir, torch, cuda):
    """time_ordered (every keep rule) and knn_edges (per pulse and per DOM) give on the GPU
    exactly what they give on the CPU, from the same batch."""
    from shardify.transforms import KEEP_RULES, knn_edges, time_ordered

    batch = next(iter(shardify.Loader(realistic_dir, batch_events=64, seed=2, device="cpu")))
    on_gpu = {k: v.to(cuda) for k, v in batch.items()}
    for keep in KEEP_RULES:
        want = time_ordered(batch, max_pulses=100, keep=keep, seed=4)
        got = time_ordered(on_gpu, max_pulses=100, keep=keep, seed=4)
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name].cpu(), want[name]), (keep, name)
    pulses = time_ordered(batch)
    pulses_gpu = {k: v.to(cuda) for k, v in pulses.items()}
    args = ("pulse_position", "event_pulse_offsets")
    want = knn_edges(*(pulses[a] for a in args), 8)
    assert torch.equal(knn_edges(*(pulses_gpu[a] for a in args), 8).cpu(), want)
    by_dom = knn_edges(*(pulses_gpu[a] for a in args), 8, groups=pulses_gpu["pulse_dom"],
                       group_count=batch["dom_position"].shape[0])
    assert torch.equal(by_dom.cpu(), want)


def test_pad_pulses_on_the_gpu_equals_the_cpu_and_at_a_fixed_length_never_waits(
        realistic_dir, torch, cuda):
    from shardify.transforms import pad_pulses, time_ordered

    batch = next(iter(shardify.Loader(realistic_dir, batch_events=64, seed=2, device="cpu")))
    pulses = time_ordered(batch, max_pulses=100)
    on_gpu = {k: v.to(cuda) for k, v in pulses.items()}
    for length in (None, 64, 128):
        want, got = pad_pulses(pulses, length), pad_pulses(on_gpu, length)
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name].cpu(), want[name]), (length, name)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        grid = pad_pulses(on_gpu, 128)  # a fixed length: nothing read back
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(grid["pulse_mask"].cpu(), pad_pulses(pulses, 128)["pulse_mask"])


def test_pulse_sequences_on_the_gpu_equal_the_cpu_and_read_nothing_back_at_a_length(
        realistic_dir, torch, cuda):
    """pulse_sequences (time_ordered's cut, pulse_features, pad_pulses) on the GPU against
    the CPU, every section (the features to float32 rounding: log10 on the two devices);
    padded to a fixed length it reads nothing back, and neither does pulse_features."""
    from shardify.transforms import pulse_features, pulse_sequences, time_ordered

    batch = next(iter(shardify.Loader(realistic_dir, batch_events=64, seed=7, device="cpu")))
    on_gpu = {k: v.to(cuda) for k, v in batch.items()}
    for standardize in (None, "graphnet"):
        want = pulse_sequences(batch, 96, keep="random", standardize=standardize, epoch=2)
        got = pulse_sequences(on_gpu, 96, keep="random", standardize=standardize, epoch=2)
        assert got.keys() == want.keys()
        for name in want:
            if name == "pulse_features":
                assert torch.allclose(got[name].cpu(), want[name], rtol=1e-6, atol=1e-7)
            else:
                assert torch.equal(got[name].cpu(), want[name]), (standardize, name)
    pulses = time_ordered(on_gpu, max_pulses=96)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        features = pulse_features(pulses, standardize="graphnet")
        grid = pulse_sequences(on_gpu, 96, keep="random", standardize="graphnet", epoch=2)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert features.shape == (pulses["pulse_time"].shape[0], 6)
    assert grid["pulse_features"].shape == (64, 96, 6)


def test_the_fused_knn_on_the_gpu_equals_the_cpu(realistic_dir, torch, cuda, monkeypatch):
    """SHARDIFY_KNN=fused: the Triton kernel's edges on the GPU, for batches cut to 256 and
    64 pulses (k = 8, 1), are the torch path's on the CPU; an uncut batch, whose largest
    event is over 256 pulses, takes the torch path on the GPU."""
    pytest.importorskip("triton")
    import shardify._knn_fused as fused
    from shardify.transforms import knn_edges, time_ordered

    calls = []
    real = fused.knn_edges_fused
    monkeypatch.setattr(fused, "knn_edges_fused", lambda *a: calls.append(a[3]) or real(*a))
    batch = next(iter(shardify.Loader(realistic_dir, batch_events=64, seed=6, device="cpu")))
    for max_pulses, k in ((256, 8), (256, 1), (64, 8), (None, 8)):
        pulses = time_ordered(batch, max_pulses=max_pulses)
        pos, offsets = pulses["pulse_position"], pulses["event_pulse_offsets"]
        monkeypatch.setenv("SHARDIFY_KNN", "torch")
        want = knn_edges(pos, offsets, k)
        monkeypatch.setenv("SHARDIFY_KNN", "fused")
        before = len(calls)
        got = knn_edges(pos.to(cuda), offsets.to(cuda), k)
        largest = int(offsets.diff().max())
        assert len(calls) - before == (largest <= 256), (max_pulses, largest)
        assert torch.equal(got.cpu(), want), (max_pulses, k)
    assert calls, "the kernel ran"


@pytest.mark.parametrize("knn", ["torch", "fused"])
@pytest.mark.parametrize("max_pulses", [256, None])
def test_to_pyg_on_the_gpu_equals_the_cpu(realistic_dir, torch, cuda, monkeypatch, max_pulses,
                                          knn):
    """to_pyg on the GPU (distances per pulse when cut to 256, by torch operations or the
    Triton kernel; per DOM uncut) gives the CPU's graphs, which group by DOM: every field."""
    pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
    if knn == "fused":
        pytest.importorskip("triton")
    from shardify.torch_geometric import to_pyg

    batch = next(iter(shardify.Loader(realistic_dir, batch_events=64, seed=3, device="cpu")))
    monkeypatch.setenv("SHARDIFY_KNN", "torch")
    want = to_pyg(batch, standardize="graphnet", knn=8, max_pulses=max_pulses).to_dict()
    monkeypatch.setenv("SHARDIFY_KNN", knn)
    got = to_pyg({k: v.to(cuda) for k, v in batch.items()}, standardize="graphnet", knn=8,
                 max_pulses=max_pulses).to_dict()
    assert got.keys() == want.keys()
    for name, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.allclose(got[name].cpu(), value, rtol=1e-6, atol=1e-7) \
                if value.is_floating_point() else torch.equal(got[name].cpu(), value), name
