"""Which device a loader chooses: ``auto`` and ``cuda`` without an index mean torch's current
CUDA device (the one a DDP rank set), as in torch; the GPU tests check it on a device."""

import pytest
import shardify
from shardify import _loader


@pytest.fixture
def current_cuda_3(monkeypatch):
    """torch's current CUDA device is 3 (a rank that called ``torch.cuda.set_device(3)``)."""
    monkeypatch.setattr(_loader, "_torch_current_cuda", lambda: 3)


def test_auto_and_cuda_mean_torchs_current_device(torch, current_cuda_3):
    for device in ("auto", "cuda", torch.device("cuda")):
        assert _loader._device_name(device, "torch") == "cuda:3", device
    # An index given is kept; the CPU stays the CPU.
    assert _loader._device_name("cuda:1", "torch") == "cuda:1"
    assert _loader._device_name(torch.device("cuda", 2), "torch") == "cuda:2"
    assert _loader._device_name(torch.device("cpu"), "torch") == "cpu"
    assert _loader._device_name("cpu", "torch") == "cpu"
    # numpy output lives on the host: auto stays for the loader to turn into the CPU.
    assert _loader._device_name("auto", "numpy") == "auto"
    assert _loader._resident_device("auto") == (torch.device("cuda", 3), "")
    assert _loader._resident_device("cuda") == (torch.device("cuda", 3), "")


def test_without_a_gpu_auto_is_the_cpu(train_dir, torch, monkeypatch):
    monkeypatch.setattr(_loader, "_torch_current_cuda", lambda: None)
    assert _loader._device_name("auto", "torch") == "auto"
    assert _loader._resident_device("auto") == (torch.device("cpu"), "torch sees no CUDA device")
    if not torch.cuda.is_available():
        loader = shardify.Loader(train_dir, batch_events=16)
        assert loader.device == torch.device("cpu")
    with pytest.raises(ValueError, match="invalid device"):
        _loader._device_name(object(), "torch")
