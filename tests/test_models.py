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
