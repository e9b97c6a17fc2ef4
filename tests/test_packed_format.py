"""Packed N:M format: exact round trips, exact popcounts, file and compressed-tensors layouts, bad inputs."""

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsedecoding.errors import PackingError
from sparsedecoding.kernels import PackedNM, pack_nm
from sparsedecoding.kernels.format import nm_pattern, popcount32
from helpers import PATTERNS, random_nm_weight


@settings(max_examples=60, deadline=None)
@given(pattern=st.sampled_from(PATTERNS + [(1, 4), (3, 4), (1, 2)]), rows=st.integers(1, 9),
       words=st.integers(1, 4), dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
       seed=st.integers(0, 2**16))
def test_pack_round_trip_and_exact_popcounts(pattern, rows, words, dtype, seed):
    n, m = pattern
    weight = random_nm_weight(rows, 32 * words, n, m, dtype, seed)
    packed = pack_nm(weight, n, m)
    assert torch.equal(packed.to_dense(), weight)
    assert packed.bitmask.dtype == torch.int32
    assert (popcount32(packed.bitmask) == 32 * n // m).all()
    assert packed.values.shape == (rows, 32 * words * n // m) and packed.values.dtype == dtype
    # values are the kept weights in increasing column order, and every nonzero is kept
    keep = packed.to_dense() != 0
    assert torch.equal(packed.values[packed.values != 0], weight[keep])


def test_groups_with_few_nonzeros_store_the_first_zeros():
    weight = torch.zeros(1, 32)
    weight[0, 2] = 5.0  # group 0 (columns 0..3) has one nonzero; all other groups none
    packed = pack_nm(weight, 2, 4)
    bits = packed.bitmask.item() & 0xFFFFFFFF
    assert bits == 0b0101 | sum(0b0011 << (4 * g) for g in range(1, 8))
    assert packed.values[0, :2].tolist() == [0.0, 5.0]


def test_bit_31_is_a_negative_int32_word_and_round_trips():
    weight = torch.zeros(2, 32)
    weight[:, 30:] = torch.tensor([[1.5, -2.0], [3.0, 4.0]])
    packed = pack_nm(weight, 16, 32)
    assert (packed.bitmask < 0).all()  # bit 31 is the sign bit
    assert torch.equal(packed.to_dense(), weight)
    assert packed.values[:, -2:].tolist() == [[1.5, -2.0], [3.0, 4.0]]


def test_load_gives_one_packing_error_for_a_damaged_file_and_save_is_whole_or_absent(tmp_path, monkeypatch):
    from safetensors.torch import load_file, save_file

    import sparsedecoding.kernels.format as format_module

    packed = pack_nm(random_nm_weight(3, 64, 2, 4), 2, 4)
    path = tmp_path / "w.safetensors"
    packed.save(path)
    whole = path.read_bytes()
    tensors = load_file(str(path))
    metadata = {"format": "sparsedecoding-nm", "n": "2", "m": "4", "shape": "[3, 64]"}
    cases = {"truncated": lambda: path.write_bytes(whole[:-40]),
             "missing": lambda: path.unlink(),
             "text": lambda: path.write_text("not safetensors"),
             "no shape": lambda: save_file(tensors, str(path), {k: v for k, v in metadata.items() if k != "shape"}),
             "no bitmask": lambda: save_file({"values": tensors["values"]}, str(path), metadata),
             "n not a number": lambda: save_file(tensors, str(path), {**metadata, "n": "two"}),
             "int16 values": lambda: save_file({**tensors, "values": tensors["values"].view(torch.int16)}, str(path),
                                               metadata)}
    for how, damage in cases.items():
        path.write_bytes(whole)
        damage()
        with pytest.raises(PackingError, match="int16" if how == "int16 values" else "not a whole packed"):
            PackedNM.load(path)
    # a save that fails part-way leaves the earlier file as it was and no temporary beside it
    path.write_bytes(whole)

    def failing_save(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(format_module, "save_file", failing_save)
    with pytest.raises(OSError, match="disk full"):
        pack_nm(random_nm_weight(3, 64, 2, 4, seed=1), 2, 4).save(path)
    assert path.read_bytes() == whole and sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]


def test_nm_pattern_of_an_empty_weight_is_none():
    assert nm_pattern(torch.zeros(0, 64)) is None and nm_pattern(torch.zeros(8, 0)) is None


@pytest.mark.parametrize("n,m", PATTERNS)
def test_save_load_round_trip(tmp_path, n, m):
    packed = pack_nm(random_nm_weight(5, 64, n, m), n, m)
    packed.save(tmp_path / "w.safetensors")
    loaded = PackedNM.load(tmp_path / "w.safetensors")
    assert (loaded.n, loaded.m, loaded.shape) == (n, m, (5, 64))
    assert torch.equal(loaded.values, packed.values) and torch.equal(loaded.bitmask, packed.bitmask)


def test_load_rejects_wrong_popcount_and_foreign_files(tmp_path):
    packed = pack_nm(random_nm_weight(3, 32, 2, 4), 2, 4)
    broken = PackedNM(packed.values, packed.bitmask ^ 1, 2, 4, packed.shape)  # flips bit 0 of every word
    broken.save(tmp_path / "broken.safetensors")
    with pytest.raises(PackingError, match="set bits"):
        PackedNM.load(tmp_path / "broken.safetensors")
    from safetensors.torch import save_file

    save_file({"weight": torch.zeros(2, 2)}, str(tmp_path / "dense.safetensors"))
    with pytest.raises(PackingError, match="not a packed N:M file"):
        PackedNM.load(tmp_path / "dense.safetensors")


@pytest.mark.parametrize("n,m", PATTERNS)
def test_compressed_tensors_export_decodes_like_that_library(n, m):
    """Decode the export the way compressed-tensors does (numpy unpackbits, little bit order, row-major
    scatter of the values) and compare with the dense weight."""
    weight = random_nm_weight(6, 96, n, m, torch.float16)
    exported = pack_nm(weight, n, m).to_compressed_tensors("model.layers.0.mlp.up_proj.weight")
    prefix = "model.layers.0.mlp.up_proj"
    assert set(exported) == {f"{prefix}.{k}" for k in ("shape", "compressed", "bitmask", "row_offsets")}
    shape = exported[f"{prefix}.shape"].tolist()
    bitmask = exported[f"{prefix}.bitmask"]
    assert shape == [6, 96] and bitmask.dtype == torch.uint8 and tuple(bitmask.shape) == (6, 12)
    mask = np.unpackbits(bitmask.numpy(), axis=-1, count=shape[-1], bitorder="little").astype(bool)
    dense = torch.zeros(shape, dtype=torch.float16)
    dense[torch.from_numpy(mask)] = exported[f"{prefix}.compressed"]
    assert torch.equal(dense, weight)
    per_row = 96 * n // m
    assert exported[f"{prefix}.row_offsets"].tolist() == [r * per_row for r in range(6)]


@pytest.mark.parametrize("weight,n,m,message", [
    (torch.ones(2, 32), 2, 4, r"not 2:4 sparse: row 0, columns 0\.\.3 hold 4 nonzeros"),
    (torch.zeros(2, 48), 2, 4, "multiple of 32"),
    (torch.zeros(2, 30), 1, 3, "M must divide 32"),
    (torch.zeros(32), 2, 4, "2-D weight"),
    (torch.zeros(2, 32, dtype=torch.int32), 2, 4, "floating-point"),
    (torch.zeros(2, 32), 4, 4, "0 < N < M"),
    (torch.zeros(2, 32), 0, 4, "0 < N < M"),
])
def test_pack_rejects_bad_inputs(weight, n, m, message):
    with pytest.raises(PackingError, match=message):
        pack_nm(weight, n, m)


def test_violation_names_the_offending_group():
    weight = random_nm_weight(4, 64, 2, 4)
    weight[3, 40:44] = 1.0
    with pytest.raises(PackingError, match=r"row 3, columns 40\.\.43 hold 4 nonzeros"):
        pack_nm(weight, 2, 4)


def test_packed_nm_rejects_inconsistent_parts():
    packed = pack_nm(random_nm_weight(2, 64, 2, 4), 2, 4)
    with pytest.raises(PackingError, match="values shape"):
        PackedNM(packed.values[:, :-1], packed.bitmask, 2, 4, packed.shape)
    with pytest.raises(PackingError, match="bitmask must be int32"):
        PackedNM(packed.values, packed.bitmask.long(), 2, 4, packed.shape)
    with pytest.raises(PackingError, match="bitmask shape"):
        PackedNM(packed.values, packed.bitmask, 2, 4, (2, 96))
