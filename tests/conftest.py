import os

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """One torch thread for tests on tiny matrices, where thread start-up costs more than the work (much more on a
    busy machine). Use with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private cache so tests never touch the user's."""
    path = tmp_path / "cache"
    monkeypatch.setenv("SPARSEDECODING_CACHE", str(path))
    return path


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """Two tiny random Llama models (different seeds) with the character tokenizer: `dense/` and `other/`."""
    from helpers import make_tiny_model

    folder = tmp_path_factory.mktemp("tiny")
    make_tiny_model(folder / "dense", seed=0)
    make_tiny_model(folder / "other", seed=1)
    return folder


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
