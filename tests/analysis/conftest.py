"""Fixtures for the analysis tests: a tiny byte-level BPE tokenizer, tiny checkpoints, the CLI."""
from __future__ import annotations


import pytest
import torch

from routescope.core_models.checkpoint import save_checkpoint
from tiny_models import tiny_model

SENTENCES = [
    "Once upon a time, there was a little girl named Lily.",
    "She loved playing with her toys in the park.",
    "One day a little boy went to the park with his dog.",
    "Solve this problem: 1 + 1 = 2. Express your answer as a fraction.",
    "Find the largest prime. Evaluate the sum and simplify.",
    "from sympy import sqrt; Python code to solve the problem.",
]
VOCAB = 320  # > the tokenizer's 256 byte tokens + merges


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread; with a busy second core (a training job) two
    OpenMP threads make a 5 ms forward take ~1 s."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES, trainer)
    # reserved tokens up to the models' vocabulary: a checkpoint's tokenizer must cover every id
    tok.add_special_tokens([f"<reserved_{i}>" for i in range(VOCAB - tok.get_vocab_size())])
    assert tok.get_vocab_size() == VOCAB
    return tok


@pytest.fixture(scope="session")
def vocab_size() -> int:
    return VOCAB


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory, tokenizer):
    """checkpoint(key, **overrides) -> path of a saved tiny model with the tokenizer (cached)."""
    made = {}

    def make(key: str, **over):
        name = key + "".join(f"-{k}{v}" for k, v in sorted(over.items()))
        if name not in made:
            model = tiny_model(key, vocab_size=VOCAB, **over)
            made[name] = save_checkpoint(model, tmp_path_factory.mktemp("ck") / name, tokenizer=tokenizer,
                                         dtype=torch.float32)
        return made[name]

    return make


@pytest.fixture(scope="session")
def cli():
    """cli(argv) -> exit code, running the `routescope` sub-commands' handlers in-process (their
    ValueErrors propagate, so a test can assert on them)."""
    from routescope.cli.main import build_parser

    parser = build_parser()

    def run(argv: list[str]) -> int:
        args = parser.parse_args([str(a) for a in argv])
        return args.func(args)

    return run
