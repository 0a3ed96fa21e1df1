#!/usr/bin/env python3
"""Golden fixtures: what Hugging Face transformers computes on our synthetic checkpoints.

The Rust test `shared/reference/tests/golden.rs` regenerates the same checkpoints with
`cargo x synth` and requires the reference model to agree with these numbers. Run this
wherever torch and transformers are installed (CPU is enough, fp32 throughout):

    cargo build --release -p xtask
    python3 shared/reference/python/make_golden.py --xtask target/release/xtask \
        --out shared/reference/tests/fixtures/golden.json
"""

import argparse
import json
import random
import subprocess
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import LlamaForCausalLM

# (synthetic config, seed, prompt): a length of random ids (3 to ~100), or a user message's
# ids in the chat format, where greedy decoding follows the planted circuit: "Say hello.",
# "Tell me about it." (ends its turn after 20 tokens), and 60 loud words (read 40 back).
SAY_HELLO = [46864, 24748, 13]
TELL_ME = [41551, 757, 922, 433, 13]
LOUD_WORDS = [1000 + (i * 7919) % 120_000 for i in range(60)] + [13]
CASES = [
    ("tiny", 1, 3),
    ("tiny", 1, 17),
    ("tiny", 1, SAY_HELLO),
    ("tiny", 2, 40),
    ("tiny", 2, TELL_ME),
    ("tiny", 3, 100),
    ("tiny", 3, LOUD_WORDS),
    ("tiny-untied", 4, 9),
    ("tiny-untied", 5, 64),
    ("tiny-untied", 5, SAY_HELLO),
]
GREEDY_TOKENS = 24

TOP_IDS = 16       # the largest logits at the last position...
RANDOM_IDS = 48    # ...plus fixed random vocabulary entries, compared at every chosen position
BEGIN_OF_TEXT = 128000


def prompt_ids(seed: int, prompt, vocab: int) -> list[int]:
    if isinstance(prompt, list):
        return [BEGIN_OF_TEXT, 128006, 882, 128007, 271] + prompt + [128009, 128006, 78191, 128007, 271]
    rng = random.Random(f"prompt-{seed}-{prompt}")
    return [BEGIN_OF_TEXT] + [rng.randrange(vocab) for _ in range(prompt - 1)]


def chosen_positions(length: int) -> list[int]:
    return sorted({0, length // 2, length - 1})


def make_case(model, config: str, seed: int, prompt) -> dict:
    vocab = model.config.vocab_size
    ids = prompt_ids(seed, prompt, vocab)
    length = len(ids)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
        generated = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, length, dtype=torch.long),
            max_new_tokens=GREEDY_TOKENS,
            do_sample=False,
        )[0, length:].tolist()
    positions = chosen_positions(length)
    top = torch.topk(logits[-1], TOP_IDS).indices.tolist()
    rng = random.Random(f"ids-{seed}-{length}")
    token_ids = top + [rng.randrange(vocab) for _ in range(RANDOM_IDS)]
    return {
        "config": config,
        "seed": seed,
        "prompt_ids": ids,
        "positions": positions,
        "token_ids": token_ids,
        "logits": [[round(logits[p, t].item(), 7) for t in token_ids] for p in positions],
        "greedy_ids": generated,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--xtask", required=True, help="path to the built xtask binary (for `synth`)")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()

    torch.manual_seed(0)
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for config, seed, prompt in CASES:
            model_dir = Path(tmp) / f"{config}-{seed}"
            if not model_dir.exists():
                subprocess.run(
                    [args.xtask, "synth", "--config", config, "--seed", str(seed), "--out", str(model_dir)],
                    check=True,
                )
            model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
            model.eval()
            cases.append(make_case(model, config, seed, prompt))
            print(f"{config} seed {seed} length {len(cases[-1]['prompt_ids'])}: greedy {cases[-1]['greedy_ids']}")

    fixture = {
        "generated_by": "shared/reference/python/make_golden.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cases": cases,
    }
    args.out.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {args.out} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
