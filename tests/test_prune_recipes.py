"""`prune --calibration self` and `prune --repair-steps`: end to end on a tiny model, the masks kept by repair, and
resumption of an interrupted repair without solving the layers or sampling the repair data again."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from sparsedecoding import pipeline, repair, selfdata
from sparsedecoding.calibration import CalibrationSet, from_segments
from sparsedecoding.cli import main
from sparsedecoding.patterns import PRUNABLE_LINEARS
from sparsedecoding.settings import PruneConfig
from helpers import make_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

PRUNED = tuple(f"{leaf}.weight" for leaf in PRUNABLE_LINEARS)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    # stage 1 of selfdata writes up to 320 tokens after a ~250-character meta-prompt (one token per character)
    return make_tiny_model(tmp_path_factory.mktemp("recipes") / "model", max_position_embeddings=1024)


def split_prompts(train: int, dev: int) -> list[str]:
    """Prompts of which exactly `dev` fall on the dev side of the 10% hash split, so neither side is empty."""
    sides: dict[bool, list[str]] = {False: [], True: []}
    for index in range(10_000):
        prompt = f"write a function number {index}"
        side = sides[selfdata.is_dev(prompt, 0.1)]
        if len(side) < (dev if side is sides[True] else train):
            side.append(prompt)
        if len(sides[False]) == train and len(sides[True]) == dev:
            return sides[False] + sides[True]
    raise AssertionError("no split found")


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("\n".join(split_prompts(train=8, dev=3)) + "\n")
    return path


def config(folder, out, prompts, **overrides) -> PruneConfig:
    values = dict(model=str(folder), out=str(out), prompts=str(prompts), pattern="2:4", tokens=40, max_new_tokens=12,
                  batch_size=4, gen_batch_size=11, do_sample=True, seed=0, device="cpu", self_meta=6, self_answers=24,
                  self_batch_size=12, self_sources=f"self=1,{prompts}=1", repair_eval_every=1, repair_batch=4,
                  repair_micro_batch=2, repair_tokens=60, repair_lr=1e-3)
    values.update(overrides)
    return PruneConfig(**values)


def manifest(out) -> dict:
    return json.loads((out / "sparsedecoding.json").read_text())


def test_self_calibration_writes_an_nm_checkpoint_with_selfdata_statistics(tiny_folder, prompts_file, tmp_path):
    out = pipeline.prune(config(tiny_folder, tmp_path / "out", prompts_file, calibration="self"), progress=False)
    for name, tensor in load_file(str(out / "model.safetensors")).items():
        if name.endswith(PRUNED):
            assert torch.all((tensor != 0).reshape(tensor.shape[0], -1, 4).sum(-1) == 2), name
    calibration = manifest(out)["calibration"]
    assert calibration["source"] == "selfdata" and calibration["tokens"] == 40
    stats = calibration["selfdata"]
    assert stats["answered"] == 24 and stats["dev_sequences"] > 0
    assert set(stats["prompts_by_source"]) == {"self", str(prompts_file)}
    assert (stats["answer_temperature"], stats["answer_top_p"]) == (0.7, 0.95)  # temperature and top-p left at 1.0
    assert not (tmp_path / "out.partial").exists()


@pytest.fixture(scope="module")
def unrepaired(tiny_folder, prompts_file, tmp_path_factory):
    # One thread, as the tests that compare with it run (`one_thread`, a function fixture, is set up after this one):
    # with two, ADMM's float32 sums can round apart and flip a mask entry that sits on a tie.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return pipeline.prune(config(tiny_folder, tmp_path_factory.mktemp("plain") / "out", prompts_file),
                              progress=False)
    finally:
        torch.set_num_threads(threads)


def test_repair_keeps_the_masks_and_reports(tiny_folder, prompts_file, unrepaired, tmp_path):
    out = pipeline.prune(config(tiny_folder, tmp_path / "out", prompts_file, repair_steps=2), progress=False)
    before, after = load_file(str(unrepaired / "model.safetensors")), load_file(str(out / "model.safetensors"))
    moved = 0
    for name, tensor in after.items():
        if name.endswith(PRUNED):
            assert torch.equal(tensor != 0, before[name] != 0), name
            moved += not torch.equal(tensor, before[name])
        else:
            assert torch.equal(tensor, before[name]), name
    report = manifest(out)["repair"]
    assert report["step"] == 2 and report["stopped_by"] == "max_steps"
    assert report["best_step"] > 0 and report["best_dev_kl"] < report["initial_dev_kl"]
    assert moved > 0  # the best state is a trained one, so the kept weights changed
    assert report["data"]["on_policy"] and report["data"]["train"]["source"] == "student"
    assert report["data"]["train"]["tokens"] == 60
    assert "repair" not in manifest(unrepaired)


def test_an_interrupted_repair_resumes_without_solving_or_sampling_again(tiny_folder, prompts_file, tmp_path,
                                                                         monkeypatch):
    straight = pipeline.prune(config(tiny_folder, tmp_path / "straight", prompts_file, repair_steps=2),
                              progress=False)
    make_config = pipeline.repair_config
    monkeypatch.setattr(pipeline, "repair_config", lambda cfg: replace(make_config(cfg), checkpoint_every=1))
    evaluate, evaluations = repair._evaluate, []

    def interrupt_at_step_two(*args):
        evaluations.append(1)
        if len(evaluations) == 2:  # step 1 is checkpointed, step 2 trained but not yet
            raise KeyboardInterrupt
        return evaluate(*args)

    monkeypatch.setattr(repair, "_evaluate", interrupt_at_step_two)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        pipeline.prune(config(tiny_folder, out, prompts_file, repair_steps=2), progress=False)
    assert json.loads((tmp_path / "resumed.partial" / "repair" / "progress.json").read_text())["step"] == 1

    solved, sampled = [], []
    monkeypatch.setattr(pipeline, "solve_layer", lambda *a: solved.append(1))
    monkeypatch.setattr(repair, "student_samples", lambda *a, **k: sampled.append(1))
    pipeline.prune(config(tiny_folder, out, prompts_file, repair_steps=2), progress=False)
    assert not solved and not sampled
    assert manifest(out)["repair"]["step"] == 2
    first, second = load_file(str(straight / "model.safetensors")), load_file(str(out / "model.safetensors"))
    for name in first:
        assert torch.equal(first[name], second[name]), name


def test_a_finished_repair_is_restored_not_trained_again(tiny_folder, prompts_file, unrepaired, tmp_path,
                                                        monkeypatch):
    source_dtype = pipeline.source_dtype

    def interrupt(folder):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "source_dtype", interrupt)  # after repair, while the checkpoint is written
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        pipeline.prune(config(tiny_folder, out, prompts_file, repair_steps=2), progress=False)
    monkeypatch.setattr(pipeline, "source_dtype", source_dtype)
    scored = []
    batch_kl = repair.batch_kl
    monkeypatch.setattr(repair, "batch_kl", lambda *a: scored.append(1) or batch_kl(*a))
    pipeline.prune(config(tiny_folder, out, prompts_file, repair_steps=2), progress=False)
    assert not scored
    assert manifest(out)["repair"]["step"] == 2 and manifest(out)["repair"]["best_step"] > 0
    before, after = load_file(str(unrepaired / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert any(not torch.equal(after[name], before[name]) for name in after if name.endswith(PRUNED))


def test_off_policy_repair_trains_on_the_dense_answers_of_the_self_train_side(tiny_folder, prompts_file, tmp_path):
    out = pipeline.prune(config(tiny_folder, tmp_path / "out", prompts_file, calibration="self", repair_steps=2,
                                repair_on_policy=False), progress=False)
    found = manifest(out)
    data, stats = found["repair"]["data"], found["calibration"]["selfdata"]
    assert not data["on_policy"] and data["train"]["source"] == data["dev"]["source"] == "selfdata"
    assert data["train"]["tokens"] == min(60, stats["decode_tokens"]["train"])
    assert data["dev"]["tokens"] == stats["decode_tokens"]["dev"]


def test_the_hash_split_of_calibration_rows_is_disjoint_complete_and_stable():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 100, (200, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[::3, :4] = 0  # left padding on some rows: the hash reads only the real tokens
    calib = CalibrationSet(torch.where(mask.bool(), ids, 0), mask, mask.bool(), "decode")
    train, dev = pipeline.split_by_hash(calib)

    def rows(part: CalibrationSet) -> set[tuple[int, ...]]:
        return {tuple(row.tolist()) for row in part.input_ids}

    assert len(train) + len(dev) == 200 and not rows(train) & rows(dev)
    assert 5 <= len(dev) <= 40
    shuffled = CalibrationSet(calib.input_ids.flip(0), calib.attention_mask.flip(0), calib.keep.flip(0), "decode")
    assert rows(pipeline.split_by_hash(shuffled)[1]) == rows(dev)  # a row's side depends on its tokens only


def test_every_sample_of_a_prompt_lands_on_one_side_of_the_hash_split():
    """Rows of decode calibration with several samples a prompt: the side comes from the prompt (the real tokens
    before the first kept position), not from the sampled answer, so no dev prompt is also trained on."""
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, 100, (5,), generator=generator).tolist() for _ in range(60)]
    rows = [(prompt, torch.randint(4, 100, (4,), generator=generator).tolist()) for prompt in prompts
            for _ in range(4)]  # four different answers to each prompt
    calib = from_segments([prompt + answer for prompt, answer in rows], [5] * len(rows), [4] * len(rows), 0,
                          "decode")
    train, dev = pipeline.split_by_hash(calib)

    def prompt_parts(part: CalibrationSet) -> set[tuple[int, ...]]:
        return {tuple(row[:5].tolist()) for row in part.input_ids}

    assert len(dev) and not prompt_parts(train) & prompt_parts(dev)
    assert len(dev) % 4 == 0  # whole prompts


@pytest.mark.parametrize("flags, backend", [([], "engine"), (["--gen-backend", "hf"], "hf")])
def test_the_gen_backend_reaches_selfdata_and_on_policy_repair(tiny_folder, prompts_file, tmp_path, monkeypatch,
                                                               flags, backend):
    """The flag (default engine) is what the generator of selfdata and of repair.student_samples is told."""
    used = set()

    def recording(module):
        real = module.generate_many

        def generate_many(*args, **kwargs):
            used.add((module.__name__, kwargs["backend"]))
            return real(*args, **kwargs)
        return generate_many

    for module in (selfdata, repair):
        monkeypatch.setattr(module, "generate_many", recording(module))
    code = main(["prune", "--model", str(tiny_folder), "--out", str(tmp_path / "out"), "--prompts", str(prompts_file),
                 "--calibration", "self", "--self-sources", f"self=1,{prompts_file}=1", "--self-meta", "6",
                 "--self-answers", "24", "--self-batch-size", "12", "--max-new-tokens", "12", "--tokens", "40",
                 "--pattern", "2:4", "--repair-steps", "1", "--repair-batch", "4", "--repair-micro-batch", "2",
                 "--repair-tokens", "60", "--device", "cpu", *flags])
    assert code == 0
    assert used == {("sparsedecoding.selfdata", backend), ("sparsedecoding.repair", backend)}
    assert manifest(tmp_path / "out")["config"]["gen_backend"] == backend


def test_repair_trains_the_linears_left_dense_with_the_kept_weights(tiny_folder, prompts_file, tmp_path):
    """--dense-linears leaves a linear unpruned; repair then trains all of it, as it trains every kept weight."""
    dense = load_file(str(tiny_folder / "model.safetensors"))
    out = pipeline.prune(config(tiny_folder, tmp_path / "out", prompts_file, repair_steps=2,
                                dense_linears="model.layers.0.mlp.down_proj"), progress=False)
    after = load_file(str(out / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    assert bool((after[name] != 0).all()) and not torch.equal(after[name], dense[name])
    assert manifest(out)["dense_linears"] == ["model.layers.0.mlp.down_proj"]
    assert manifest(out)["repair"]["best_step"] > 0
