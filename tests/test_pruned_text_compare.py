"""benchmarks/pruned_text_compare.py without a real model: the teacher-forced scores, the masks' agreement and the
arguments it refuses."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from helpers import benchmark_module


class Table(torch.nn.Module):
    """A model whose next-token logits depend only on the current token: a fixed table."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = torch.nn.Parameter(logits)

    def forward(self, ids):
        return SimpleNamespace(logits=self.logits[ids])


def test_scores_equal_a_hand_computation(monkeypatch):
    compare = benchmark_module(monkeypatch, "pruned_text_compare")
    torch.manual_seed(0)
    p, q = Table(torch.randn(5, 5)), Table(torch.randn(5, 5))
    ids = [0, 3, 1, 4, 2, 2, 0, 1, 3]  # two windows of 4; the last token is left out
    scores = compare.text_scores(p, q, ids, window=4, batch_size=1)
    pairs = [(a, b) for window in (ids[0:4], ids[4:8]) for a, b in zip(window, window[1:])]
    log_p, log_q = p.logits.detach().log_softmax(-1), q.logits.detach().log_softmax(-1)
    nll = -sum(float(log_q[a, b]) for a, b in pairs) / len(pairs)
    kl = sum(float((log_p[a].exp() * (log_p[a] - log_q[a])).sum()) for a, _ in pairs) / len(pairs)
    agree = sum(int(log_p[a].argmax() == log_q[a].argmax()) for a, _ in pairs) / len(pairs)
    assert scores["tokens"] == 6
    assert scores["ppl"] == pytest.approx(math.exp(nll), rel=1e-5)
    assert scores["kl"] == pytest.approx(kl, rel=1e-5) and scores["top1_agree"] == pytest.approx(agree)
    assert compare.text_scores(p, p, ids, 4, 2)["kl"] == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(SystemExit, match="fewer than one window"):
        compare.text_scores(p, q, ids[:3], 4, 1)


class Masked(Table):
    """`Table` called as a transformers model with a mask and positions (which it must be given, and ignores)."""

    def forward(self, input_ids, attention_mask, position_ids):
        assert attention_mask.shape == input_ids.shape == position_ids.shape
        return super().forward(input_ids)


def test_decode_scores_count_only_the_kept_positions(monkeypatch):
    compare = benchmark_module(monkeypatch, "pruned_text_compare")
    from sparsedecoding.calibration import CalibrationSet

    torch.manual_seed(1)
    p, q = Masked(torch.randn(6, 6)), Masked(torch.randn(6, 6))
    ids = torch.tensor([[0, 0, 2, 5, 1, 3], [4, 1, 1, 0, 2, 5]])  # row 0 left-padded by two
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    keep = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 0, 1, 0, 1, 1]], dtype=torch.bool)
    calibration = CalibrationSet(ids, mask, keep, "test")
    log_p, log_q = p.logits.detach().log_softmax(-1), q.logits.detach().log_softmax(-1)
    tokens = [int(token) for token in ids[keep]]
    kl = sum(float((log_p[t].exp() * (log_p[t] - log_q[t])).sum()) for t in tokens) / len(tokens)
    agree = sum(int(log_p[t].argmax() == log_q[t].argmax()) for t in tokens) / len(tokens)
    for batch_size in (1, 2):
        scores = compare.decode_scores(p, q, calibration, batch_size)
        assert scores["decode_tokens"] == 5
        assert scores["decode_kl"] == pytest.approx(kl, rel=1e-5)
        assert scores["decode_top1_agree"] == pytest.approx(agree)
    assert compare.decode_scores(p, p, calibration, 2)["decode_kl"] == pytest.approx(0.0, abs=1e-6)


def test_masks_of_the_prunable_linears_and_their_agreement(monkeypatch, tmp_path):
    compare = benchmark_module(monkeypatch, "pruned_text_compare")
    weight = torch.tensor([[1.0, 0.0, 2.0, 0.0]])
    for name, w in (("a", weight), ("b", torch.tensor([[1.0, 3.0, 0.0, 0.0]]))):
        (tmp_path / name).mkdir()
        save_file({"model.layers.0.mlp.down_proj.weight": w, "model.norm.weight": torch.zeros(4)},
                  str(tmp_path / name / "model.safetensors"))
    a, b = compare.masks(tmp_path / "a"), compare.masks(tmp_path / "b")
    assert list(a) == ["model.layers.0.mlp.down_proj.weight"]  # the norm is not a prunable linear
    assert compare.same_share(a, b) == 0.5 and compare.same_share(a, a) == 1.0
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no prunable linear"):
        compare.masks(tmp_path / "empty")


def test_bad_arguments_are_one_error_before_any_model_loads(monkeypatch, tmp_path, capsys):
    compare = benchmark_module(monkeypatch, "pruned_text_compare")
    out = str(tmp_path / "r.md")
    for pruned in (["f32"], ["=x"], [f"a={tmp_path}"]):
        with pytest.raises(SystemExit) as stop:
            compare.main(["--dense", "nowhere", "--pruned", *pruned, "--out", out])
        assert stop.value.code == 2
    assert "not a pruned folder" in capsys.readouterr().err
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "sparsedecoding.json").write_text("{}")
    for extra, message in ((["--out", str(tmp_path / "missing" / "r.md")], "its folder does not exist"),
                           (["--out", out, "--max-tokens", "100"], "less than one window"),
                           (["--out", out, "--decode-set", str(tmp_path / "none.safetensors")],
                            "not a calibration set")):
        with pytest.raises(SystemExit) as stop:
            compare.main(["--dense", "nowhere", "--pruned", f"a={tmp_path / 'p'}", *extra])
        assert stop.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "r.md").exists()
