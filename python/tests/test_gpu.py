"""On a CUDA device (skipped, saying so, without one): the device epoch equals the CPU
epoch, and torch work queued on its current stream sees complete batches."""

import pytest
import shardify


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
    device_batches = [{k: v.cpu() for k, v in b.items() if True}
                      for b in loader if all(t.is_cuda for t in b.values())]
    expected = host_epoch(train_dir)
    assert len(device_batches) == len(expected)
    for got, want in zip(device_batches, expected, strict=True):
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), name


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
