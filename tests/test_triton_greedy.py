"""The greedy step's kernel (`kernels.triton_greedy`): torch.argmax's indices (the first maximum; NaN above
everything) written into the token buffer and the position advanced by one, for one and many chunks of the
vocabulary, ties and NaN across chunks, rows of -inf, bf16 / fp16 / fp32; the engine's tokens with it and without;
one clear error per bad input. Under the Triton interpreter on CPU (TRITON_INTERPRET=1 set before the kernel module
is imported) and on the GPU."""

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

from sparsedecoding.errors import KernelInputError  # noqa: E402
from sparsedecoding.kernels.triton_greedy import BLOCK, GreedyScratch, greedy_step  # noqa: E402


def run(logits: torch.Tensor, position: int = 7) -> tuple[torch.Tensor, torch.Tensor, GreedyScratch]:
    rows, vocab = logits.shape
    token = torch.full((rows, 1), -1, dtype=torch.long, device=DEVICE)
    where = torch.tensor([position], device=DEVICE)
    scratch = GreedyScratch.create(rows, vocab, torch.device(DEVICE))
    greedy_step(logits, token, where, scratch)
    return token, where, scratch


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows,vocab", [(1, 1000), (3, BLOCK), (2, 3 * BLOCK + 5), (1, 151936)])
def test_matches_torch_argmax(rows, vocab, dtype):
    generator = torch.Generator().manual_seed(vocab)
    logits = (torch.randn(rows, vocab, generator=generator) * 4).to(dtype).to(DEVICE)
    token, position, scratch = run(logits)
    assert torch.equal(token[:, 0], logits.argmax(-1))
    assert position.item() == 8
    assert not scratch.counters.any()  # ready for the next call


def test_ties_nan_and_negative_infinity_as_torch():
    vocab = 3 * BLOCK + 100
    logits = torch.randn(5, vocab)
    logits[0, [BLOCK + 3, 2 * BLOCK + 9, 17]] = 50.0  # a tie across chunks: the first wins
    logits[1, [2 * BLOCK + 1, BLOCK + 40]] = float("nan")  # NaN beats everything: the first NaN
    logits[1, 5] = float("inf")
    logits[2] = float("-inf")  # nothing above -inf: position 0
    logits[3, -1] = float("inf")  # the last position, in a short last chunk
    logits[4, BLOCK - 1] = float("nan")  # the last position of a chunk
    logits = logits.bfloat16().to(DEVICE)
    token, _, _ = run(logits)
    assert torch.equal(token[:, 0], logits.argmax(-1))
    assert token[:, 0].tolist() == [17, BLOCK + 40, 0, vocab - 1, BLOCK - 1]


def test_repeated_calls_reuse_the_scratch():
    """The counters are reset by each call, so one scratch serves every step (as in a captured graph)."""
    vocab = 2 * BLOCK + 1
    scratch = GreedyScratch.create(2, vocab, torch.device(DEVICE))
    token = torch.zeros(2, 1, dtype=torch.long, device=DEVICE)
    position = torch.tensor([0], device=DEVICE)
    for step in range(3):
        logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(step)).bfloat16().to(DEVICE)
        greedy_step(logits, token, position, scratch)
        assert torch.equal(token[:, 0], logits.argmax(-1))
    assert position.item() == 3


@pytest.mark.parametrize("change,message", [
    (lambda a: a.update(logits=a["logits"][:, ::2]), "logits must be"),
    (lambda a: a.update(logits=a["logits"].long()), "logits must be"),
    (lambda a: a.update(logits=a["logits"][:1]), "do not match the scratch"),
    (lambda a: a.update(token=a["token"].int()), "token must be"),
    (lambda a: a.update(token=a["token"][:, 0]), "token must be"),
    (lambda a: a.update(position=a["position"].int()), "position must be"),
])
def test_bad_inputs_give_one_clear_error(change, message):
    args = dict(logits=torch.randn(2, 300).to(DEVICE), token=torch.zeros(2, 1, dtype=torch.long, device=DEVICE),
                position=torch.zeros(1, dtype=torch.long, device=DEVICE),
                scratch=GreedyScratch.create(2, 300, torch.device(DEVICE)))
    change(args)
    with pytest.raises(KernelInputError, match=message):
        greedy_step(**args)


@pytest.mark.parametrize("value,fails", [(None, False), ("1", False), ("0", False), ("yes", True)])
def test_the_setting_is_checked(value, fails, monkeypatch):
    from sparsedecoding.kernels.op import KernelChoiceError, fused_greedy_setting

    if value is None:
        monkeypatch.delenv("SPARSEDECODING_FUSED_GREEDY", raising=False)
    else:
        monkeypatch.setenv("SPARSEDECODING_FUSED_GREEDY", value)
    if fails:
        with pytest.raises(KernelChoiceError, match="SPARSEDECODING_FUSED_GREEDY='yes'"):
            fused_greedy_setting()
    else:
        assert fused_greedy_setting() == (value != "0")


def test_the_engine_generates_the_same_tokens_with_the_kernel(monkeypatch):
    """A tiny random model's greedy generation (eager; compiled and captured on a GPU) gives the same tokens with
    the fused greedy step as with the two-stage argmax, copy and add."""
    from sparsedecoding.engine import build_model, random_state
    from sparsedecoding.engine.config import ModelArgs
    from sparsedecoding.engine.generate import Engine

    args = ModelArgs(architecture="llama", vocab_size=3 * BLOCK + 7, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                     head_dim=16, intermediate_size=96, norm_eps=1e-5, rope_theta=10000.0)
    torch.manual_seed(0)
    model = build_model(args, random_state(args, None, torch.bfloat16, DEVICE))
    prompt = torch.randint(0, args.vocab_size, (2, 5))
    tokens = {}
    for value in ("0", "1"):
        monkeypatch.setenv("SPARSEDECODING_FUSED_GREEDY", value)
        engine = Engine(model, 2, 32, compile=DEVICE == "cuda")
        assert engine.fused_greedy == (value == "1")
        tokens[value] = engine.generate(prompt, 12).tokens
    assert torch.equal(tokens["0"], tokens["1"])
