"""Torch tensors made through torch's DLPack C exchange API against its capsule import: the
same batches, the loader's own path through the exchange, the capsules where a type has
none, and a clear error where a type's table is broken."""

import numpy as np
import pytest
import shardify
from conftest import assert_same_batches

SETTINGS = dict(batch_events=16, device="cpu", seed=5, output="torch")


def needs_exchange(torch):
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip(f"torch {torch.__version__} has no DLPack C exchange API")


def assert_same_batch(a, b, torch):
    assert all(type(t) is torch.Tensor for t in (*a.values(), *b.values()))
    assert_same_batches([a], [b], torch)


def test_exchange_and_capsules_make_the_same_batches(train_dir, torch):
    needs_exchange(torch)
    via_capsules = shardify.Loader(train_dir, **SETTINGS)._native
    via_exchange = shardify.Loader(train_dir, **SETTINGS)._native
    convert = torch._C._from_dlpack
    batches = 0
    while (a := via_capsules.next_batch_dict(convert)) is not None:
        b = via_exchange.next_batch_dict(convert, None, torch.Tensor)
        assert b is not None
        assert_same_batch(a, b, torch)
        # Zero copy: each tensor views its batch's buffer, writable.
        times = b["pulse_time"]
        times[0] = 4321.0
        assert np.from_dlpack(times)[0] == 4321.0
        batches += 1
    assert via_exchange.next_batch_dict(convert, None, torch.Tensor) is None
    assert batches == -(-300 // 16)


def test_the_loader_makes_its_tensors_through_the_exchange(train_dir, torch, monkeypatch):
    needs_exchange(torch)
    expected = [dict(b) for b in shardify.Loader(train_dir, **SETTINGS)]
    imports = []
    original = torch._C._from_dlpack

    def counted(capsule):
        imports.append(1)
        return original(capsule)

    monkeypatch.setattr(torch._C, "_from_dlpack", counted)
    got = list(shardify.Loader(train_dir, **SETTINGS))
    assert imports == [], "the capsule import ran although torch has the exchange API"
    assert len(got) == len(expected) == -(-300 // 16)
    for a, b in zip(expected, got, strict=True):
        assert_same_batch(a, b, torch)


def test_a_type_without_an_exchange_gets_convert(train_dir, torch):
    loader = shardify.Loader(train_dir, **SETTINGS)._native
    reference = shardify.Loader(train_dir, **SETTINGS)._native
    sections = len(loader.sections())
    calls = []

    def convert(capsule):
        calls.append(1)
        return torch._C._from_dlpack(capsule)

    # The first type asked for is remembered; another is looked up anew, each call.
    first = loader.next_batch_dict(convert, None, torch.Tensor)
    assert_same_batch(reference.next_batch_dict(convert), first, torch)
    calls.clear()
    batches = 0
    while (batch := loader.next_batch_dict(convert, None, object)) is not None:
        assert_same_batch(reference.next_batch_dict(torch._C._from_dlpack), batch, torch)
        batches += 1
    assert batches == -(-300 // 16) - 1
    assert len(calls) == batches * sections


@pytest.mark.parametrize("table", ["text", "capsule of another name"])
def test_a_broken_exchange_table_is_an_error_and_loses_no_batch(train_dir, torch, table):
    class Broken:
        __dlpack_c_exchange_api__ = (
            "not a capsule" if table == "text" else np.zeros(3).__dlpack__()
        )

    loader = shardify.Loader(train_dir, **SETTINGS)._native
    reference = shardify.Loader(train_dir, **SETTINGS)._native
    convert = torch._C._from_dlpack
    with pytest.raises(ValueError, match="PyCapsule"):
        loader.next_batch_dict(convert, None, Broken)
    assert loader.position() == reference.position()
    assert_same_batch(reference.next_batch_dict(convert), loader.next_batch_dict(convert),
                      torch)
