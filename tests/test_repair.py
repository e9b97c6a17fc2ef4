"""Fixed-mask repair by distillation on a tiny model: masks, loss, early stopping, resumption, errors."""

from __future__ import annotations

import pytest
import torch

from sparsedecoding.calibration import from_segments
from sparsedecoding.errors import RepairError
from sparsedecoding.models import load_model
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.repair import (RepairConfig, batch_indices, kl_sum, learning_rate, mean_kl, pruned_masks, repair,
                                   student_samples)
from helpers import make_tiny_model, prune_in_place


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def teacher_folder(tmp_path_factory):
    """The tiny model with a 30x output layer: random weights alone give near-uniform next-token distributions,
    where pruning hardly moves the KL."""
    folder = make_tiny_model(tmp_path_factory.mktemp("repair") / "dense", seed=0)
    model, tokenizer, _ = load_model(folder)
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    model.save_pretrained(folder)
    return folder


def pruned_student(folder):
    """The teacher with every decoder linear cut to 2:4 by magnitude."""
    student = load_model(folder)[0]
    with torch.no_grad():
        prune_in_place(student, SparsityPattern.parse("2:4"))
    return student


def random_set(count: int, seed: int):
    """Random token sequences of varied lengths; positions from 6 on are kept, as decode positions would be."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(12, 24, (count,), generator=generator).tolist()
    sequences = [torch.randint(4, 128, (length,), generator=generator).tolist() for length in lengths]
    return from_segments(sequences, [6] * count, [length - 6 for length in lengths], 0, "decode")


@pytest.fixture(scope="module")
def data():
    return random_set(24, 1), random_set(8, 2)


def config(**overrides) -> RepairConfig:
    values = dict(lr=3e-4, schedule="constant", warmup_steps=0, batch_size=8, micro_batch_size=4, max_steps=20,
                  time_budget_s=None, eval_every=5, checkpoint_every=5, patience=100, kl_chunk=16,
                  gradient_checkpointing=False)
    values.update(overrides)
    return RepairConfig(**values)


def trained_state(model) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def test_masks_stay_fixed_and_train_kl_falls(teacher_folder, data, tmp_path):
    teacher = load_model(teacher_folder)[0]
    student = pruned_student(teacher_folder)
    train, dev = data
    masks = pruned_masks(student)
    before = trained_state(student)
    kl_before = mean_kl(teacher, student, train, 8, 16)
    # dev = train: this test is about fitting the training data, so early stopping must not undo it.
    report = repair(teacher, student, train, train, tmp_path / "work", config(gradient_checkpointing=True))
    kl_after = mean_kl(teacher, student, train, 8, 16)
    parameters = dict(student.named_parameters())
    for name, mask in masks.items():
        assert torch.equal(parameters[name] != 0, mask), name
    assert any(not torch.equal(before[name], parameters[name]) for name in masks)
    assert kl_after < 0.8 * kl_before
    assert report["step"] == 20 and report["stopped_by"] == "max_steps"
    assert report["tokens"] == sum(int(train.keep[batch_indices(step, 8, 24, 0)].sum())
                                    for step in range(20))
    # Embeddings, norms and the output layer are not trained by default.
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        assert torch.equal(before[name], parameters[name])


def test_repair_keeps_a_grouped_mask_tileable(teacher_folder, data, tmp_path):
    """A 16:32g student (plan-grouped-repair.json repairs one) comes out of repair still 16:32g: every 16-row tile's
    32-column word keeps a split under which each row keeps two of every group of four."""
    from sparsedecoding.solvers import grouped_order_of

    teacher = load_model(teacher_folder)[0]
    student = load_model(teacher_folder)[0]
    with torch.no_grad():
        prune_in_place(student, SparsityPattern.parse("16:32g"))
    train, dev = data
    masks = pruned_masks(student)
    repair(teacher, student, train, dev, tmp_path / "work", config(max_steps=6))
    parameters = dict(student.named_parameters())
    for name, mask in masks.items():
        kept = parameters[name] != 0
        assert torch.equal(kept, mask), name
        rows, cols = kept.shape
        words = kept.reshape(rows // 16, 16, cols // 32, 32).permute(0, 2, 1, 3).reshape(-1, 16, 32)
        assert bool(grouped_order_of(words)[1].all()), name


def test_chunked_kl_and_its_gradient_match_the_whole_vocabulary_reference():
    torch.manual_seed(0)
    head_s, head_t = torch.nn.Linear(8, 50, bias=False), torch.nn.Linear(8, 50, bias=False)
    hidden_s = torch.randn(13, 8, requires_grad=True)
    hidden_t = torch.randn(13, 8)
    chunked = kl_sum(hidden_s, hidden_t, head_s, head_t, chunk=4)
    (grad_chunked,) = torch.autograd.grad(chunked, hidden_s)
    log_p = head_t(hidden_t).double().log_softmax(-1)
    log_q = head_s(hidden_s).double().log_softmax(-1)
    reference = (log_p.exp() * (log_p - log_q)).sum()
    (grad_reference,) = torch.autograd.grad(reference, hidden_s)
    torch.testing.assert_close(chunked.double(), reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_chunked.double(), grad_reference.double(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("lr", [1e-4, 1e-3])
def test_early_stopping_restores_the_best_dev_state(teacher_folder, data, tmp_path, lr):
    teacher = load_model(teacher_folder)[0]
    train, dev = data
    # Random sequences share little structure, so dev KL stalls while train KL falls and patience ends the run:
    # at 1e-4 after a few small gains, at 1e-3 with the untrained model still the best.
    student = pruned_student(teacher_folder)
    report = repair(teacher, student, train, dev, tmp_path / "work", config(lr=lr, max_steps=60, patience=2))
    dev_curve = [record["dev_kl"] for record in report["curve"]]
    assert report["stopped_by"] == "patience"
    assert report["best_dev_kl"] == min(dev_curve) == dev_curve[report["best_step"] // 5]
    assert report["best_step"] < report["step"]
    assert mean_kl(teacher, student, dev, 4, 16, 256) == pytest.approx(report["best_dev_kl"], rel=1e-6)
    untouched = all(torch.equal(a, b) for a, b in zip(student.state_dict().values(),
                                                       pruned_student(teacher_folder).state_dict().values()))
    assert untouched == (report["best_step"] == 0)


def test_resume_after_interruption_matches_an_uninterrupted_run(teacher_folder, data, tmp_path):
    teacher = load_model(teacher_folder)[0]
    train, dev = data
    settings = config(schedule="cosine", warmup_steps=3)
    whole = pruned_student(teacher_folder)
    expected = repair(teacher, whole, train, dev, tmp_path / "whole", settings)

    class Interrupted(Exception):
        pass

    def stop_at_ten(record):
        if record["step"] == 10:
            raise Interrupted

    with pytest.raises(Interrupted):
        repair(teacher, pruned_student(teacher_folder), train, dev, tmp_path / "cut", settings, on_eval=stop_at_ten)
    resumed_model = pruned_student(teacher_folder)
    evaluated = []
    resumed = repair(teacher, resumed_model, train, dev, tmp_path / "cut", settings,
                     on_eval=lambda record: evaluated.append(record["step"]))
    assert evaluated == [15, 20]  # it went on from the checkpoint at step 10 instead of starting again
    for (name, a), b in zip(whole.state_dict().items(), resumed_model.state_dict().values()):
        assert torch.equal(a, b), name
    assert [(r["step"], r["tokens"], r["dev_kl"]) for r in resumed["curve"]] == \
        [(r["step"], r["tokens"], r["dev_kl"]) for r in expected["curve"]]


@pytest.mark.parametrize("dies_after", ["masters", "optimizer", "best"])
def test_a_crash_inside_a_checkpoint_resumes_from_the_last_whole_one(teacher_folder, data, tmp_path, monkeypatch,
                                                                     dies_after):
    """The process dies after one of step 10's tensor files is written (before its progress file): the resume must
    take step 5's files, which progress.json still names, and end where an uninterrupted run ends."""
    from sparsedecoding import repair as repair_module

    teacher = load_model(teacher_folder)[0]
    train, dev = data
    whole = pruned_student(teacher_folder)
    expected = repair(teacher, whole, train, dev, tmp_path / "whole", config())
    written = repair_module.save_file

    class Died(Exception):
        pass

    def dying(tensors, filename, *args, **kwargs):
        written(tensors, filename, *args, **kwargs)
        if filename.endswith(f"{dies_after}-10.safetensors"):
            raise Died

    monkeypatch.setattr(repair_module, "save_file", dying)
    with pytest.raises(Died):
        repair(teacher, pruned_student(teacher_folder), train, dev, tmp_path / "cut", config())
    monkeypatch.setattr(repair_module, "save_file", written)
    resumed_model = pruned_student(teacher_folder)
    resumed = repair(teacher, resumed_model, train, dev, tmp_path / "cut", config())
    for (name, a), b in zip(whole.state_dict().items(), resumed_model.state_dict().values()):
        assert torch.equal(a, b), name
    assert [(r["step"], r["dev_kl"]) for r in resumed["curve"]] == [(r["step"], r["dev_kl"]) for r in expected["curve"]]
    assert sorted(path.name for path in (tmp_path / "cut").glob("*.safetensors")) == \
        ["best-20.safetensors", "masters-20.safetensors", "optimizer-20.safetensors"]  # only the last step's


@pytest.mark.parametrize("overrides, words", [
    ({"lr": 0.0}, "lr"), ({"schedule": "linear"}, "schedule"), ({"eval_every": 5, "checkpoint_every": 7}, "multiple"),
    ({"batch_size": 0}, "batch_size"), ({"warmup_steps": 20, "max_steps": 20}, "warmup"),
    ({"train_extra": "all"}, "train_extra"), ({"token_budget": 0}, "token_budget"),
])
def test_bad_settings_give_one_line_errors(overrides, words):
    with pytest.raises(RepairError, match=words) as caught:
        config(**overrides).validate()
    assert "\n" not in str(caught.value)


def test_mismatched_models_and_reused_folders_are_refused(teacher_folder, data, tmp_path):
    teacher = load_model(teacher_folder)[0]
    train, dev = data
    other = load_model(make_tiny_model(tmp_path / "wide", intermediate_size=192))[0]
    with pytest.raises(RepairError, match="does not match"):
        repair(teacher, other, train, dev, tmp_path / "a", config())
    repair(teacher, pruned_student(teacher_folder), train, dev, tmp_path / "b", config(max_steps=5))
    with pytest.raises(RepairError, match="other settings"):
        repair(teacher, pruned_student(teacher_folder), train, dev, tmp_path / "b", config(max_steps=5, lr=1e-3))


def test_norms_and_biases_train_only_when_asked(teacher_folder, data, tmp_path):
    teacher = load_model(teacher_folder)[0]
    student = pruned_student(teacher_folder)
    before = trained_state(student)
    train, dev = data
    report = repair(teacher, student, train, dev, tmp_path / "w", config(max_steps=5, train_extra="norms_biases"))
    after = student.state_dict()
    assert report["trained_tensors"] == 2 * 7 + 2 * 2 + 1  # 7 linears and 2 norms per layer, the final norm
    assert not torch.equal(before["model.norm.weight"], after["model.norm.weight"])


def test_schedule_and_data_order():
    settings = config(lr=1.0, schedule="cosine", warmup_steps=4, max_steps=14)
    assert [learning_rate(settings, step) for step in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert learning_rate(settings, 9) == pytest.approx(0.5)
    assert learning_rate(settings, 14) == pytest.approx(0.0)
    stream = [index for step in range(6) for index in batch_indices(step, 5, 10, seed=3)]
    assert sorted(stream[:10]) == sorted(stream[10:20]) == list(range(10))
    assert stream[:10] != stream[10:20]


def test_student_samples_keep_exactly_the_decode_positions(teacher_folder):
    student, tokenizer, _ = load_model(teacher_folder)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    calib = student_samples(student, tokenizer, prompts, max_new_tokens=9, batch_size=2, seed=1, progress=False)
    assert len(calib) >= 1
    for ids, mask, keep in zip(calib.input_ids, calib.attention_mask, calib.keep):
        real = ids[mask.bool()].tolist()
        prompt = next(prompt for prompt in prompts if real[:len(prompt)] == prompt)
        assert ids[keep].tolist() == real[len(prompt):] and len(real) - len(prompt) <= 8


@pytest.mark.gpu
def test_repair_runs_in_bfloat16_on_cuda_with_masks_fixed(teacher_folder, data, tmp_path):
    teacher = load_model(teacher_folder, device="cuda", dtype=torch.bfloat16)[0]
    student = load_model(teacher_folder, device="cuda", dtype=torch.bfloat16)[0]
    with torch.no_grad():
        prune_in_place(student, SparsityPattern.parse("2:4"))
    train, _ = data
    masks = pruned_masks(student)
    kl_before = mean_kl(teacher, student, train, 8, 16)
    repair(teacher, student, train, train, tmp_path / "work", config(gradient_checkpointing=True))
    parameters = dict(student.named_parameters())
    assert all(torch.equal(parameters[name] != 0, mask) for name, mask in masks.items())
    assert all(parameters[name].dtype == torch.bfloat16 for name in masks)
    assert mean_kl(teacher, student, train, 8, 16) < kl_before


@pytest.mark.parametrize("bad_steps,stopped_by", [({1}, "max_steps"), (set(range(20)), "non_finite")])
def test_a_non_finite_step_is_skipped_and_counted_and_masks_stay_zero(teacher_folder, data, tmp_path, monkeypatch,
                                                                      bad_steps, stopped_by):
    """An overflowing batch (inf loss, NaN gradient) must not reach the weights, pruned ones included."""
    from sparsedecoding import repair as repair_module

    teacher = load_model(teacher_folder)[0]
    student = pruned_student(teacher_folder)
    train, dev = data
    masks = pruned_masks(student)
    calls = {"n": 0}
    real = repair_module.batch_kl

    def overflowing(*args, **kwargs):
        loss = real(*args, **kwargs)
        step = calls["n"] // 2  # two micro-batches per step
        calls["n"] += 1
        return loss * float("inf") if step in bad_steps else loss

    monkeypatch.setattr(repair_module, "batch_kl", overflowing)
    report = repair(teacher, student, train, dev, tmp_path / "work", config(max_skipped_steps=3))
    parameters = dict(student.named_parameters())
    for name, mask in masks.items():
        assert torch.isfinite(parameters[name]).all(), name
        assert torch.equal(parameters[name] != 0, mask), name
    assert report["stopped_by"] == stopped_by
    assert report["skipped_steps"] == (1 if stopped_by == "max_steps" else 4)


def test_a_non_finite_stop_between_evaluations_scores_and_saves_its_last_step(teacher_folder, data, tmp_path,
                                                                               monkeypatch):
    """The fourth skipped step (7) falls between evaluations (every 5): the run still scores step 7 and saves a
    finished checkpoint, so a rerun of the folder does not train again."""
    from sparsedecoding import repair as repair_module

    teacher, student = load_model(teacher_folder)[0], pruned_student(teacher_folder)
    train, dev = data
    calls, real = {"n": 0}, repair_module.batch_kl

    def overflowing(teacher, student, *args, **kwargs):
        loss = real(teacher, student, *args, **kwargs)
        if not student.training:  # a dev evaluation
            return loss
        step = calls["n"] // 2  # two micro-batches per step
        calls["n"] += 1
        return loss * float("inf") if step in {1, 2, 3, 6} else loss

    monkeypatch.setattr(repair_module, "batch_kl", overflowing)
    report = repair(teacher, student, train, dev, tmp_path / "work", config(max_skipped_steps=3))
    assert report["stopped_by"] == "non_finite" and report["step"] == 7 and report["curve"][-1]["step"] == 7
    monkeypatch.setattr(repair_module, "batch_kl", lambda *args, **kwargs: pytest.fail("trained again"))
    again = repair(teacher, pruned_student(teacher_folder), train, dev, tmp_path / "work", config(max_skipped_steps=3))
    assert again["stopped_by"] == "non_finite" and again["step"] == 7


def test_a_run_stopped_by_its_time_budget_goes_on_when_resumed_with_more(teacher_folder, data, tmp_path):
    teacher, student = load_model(teacher_folder)[0], pruned_student(teacher_folder)
    train, dev = data
    first = repair(teacher, student, train, dev, tmp_path / "work", config(time_budget_s=1e-9, max_steps=10))
    assert first["stopped_by"] == "time_budget" and first["step"] < 10
    second = repair(teacher, pruned_student(teacher_folder), train, dev, tmp_path / "work",
                    config(time_budget_s=None, max_steps=10))
    assert second["stopped_by"] == "max_steps" and second["step"] == 10


def test_a_finished_time_budget_run_is_not_trained_again_with_the_same_budget(teacher_folder, data, tmp_path,
                                                                              monkeypatch):
    """The budget runs out inside an evaluation's callback; the stop records the time it was seen, so a rerun with
    the same budget finds it spent."""
    import time as clock

    from sparsedecoding import repair as repair_module

    teacher, student = load_model(teacher_folder)[0], pruned_student(teacher_folder)
    train, dev = data
    settings = config(time_budget_s=0.5, eval_every=1, max_steps=50)
    first = repair(teacher, student, train, dev, tmp_path / "work", settings, on_eval=lambda record: clock.sleep(0.6))
    assert first["stopped_by"] == "time_budget" and first["seconds"] >= 0.5
    monkeypatch.setattr(repair_module, "batch_kl", lambda *args, **kwargs: pytest.fail("trained again"))
    again = repair(teacher, pruned_student(teacher_folder), train, dev, tmp_path / "work", settings)
    assert again["step"] == first["step"]
