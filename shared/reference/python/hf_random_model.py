#!/usr/bin/env python3
"""A checkpoint as transformers itself makes one: its default random initialisation, saved
with `save_pretrained` in bf16, and the directory's config.json kept exactly as it was.

Our synthetic checkpoints plant a circuit; this one has none, so it shows how our limits
hold on weights we did not design. With --outliers it also plants outlier activations like
real models': a few residual-stream channels that layer 1's MLP makes about 100 times as
large as the others, at every position.

    python3 hf_random_model.py --out DIR [--outliers] [--seed N]

DIR must hold the config.json to build from (`cargo x gpu-check` writes Meta's there).
"""

import argparse
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

OUTLIER_CHANNELS = [7, 891, 1500, 2001]
OUTLIER_SIZE = 100.0  # times the other channels' root mean square, after layer 1


def plant_outliers(model: LlamaForCausalLM) -> float:
    """Scales layer 1's down_proj rows for OUTLIER_CHANNELS until those channels of the
    stream after layer 1 are OUTLIER_SIZE times the others; returns the ratio reached."""
    ids = torch.arange(1000, 1064).unsqueeze(0)
    down = model.model.layers[1].mlp.down_proj.weight
    others = [c for c in range(model.config.hidden_size) if c not in OUTLIER_CHANNELS]
    for _ in range(4):  # the stream also holds the embedding, so one scaling falls short
        with torch.no_grad():
            stream = model(ids, output_hidden_states=True).hidden_states[2][0].float()
            rms_others = stream[:, others].pow(2).mean().sqrt()
            for channel in OUTLIER_CHANNELS:
                down[channel] *= OUTLIER_SIZE * rms_others / stream[:, channel].pow(2).mean().sqrt()
    with torch.no_grad():
        stream = model(ids, output_hidden_states=True).hidden_states[2][0].float()
    return (stream[:, OUTLIER_CHANNELS].pow(2).mean().sqrt() / stream[:, others].pow(2).mean().sqrt()).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--outliers", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    config_text = (args.out / "config.json").read_text()
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(LlamaConfig.from_pretrained(args.out)).eval()
    if args.outliers:
        print(f"outlier channels {OUTLIER_CHANNELS}: {plant_outliers(model):.0f}x the others after layer 1")
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    (args.out / "config.json").write_text(config_text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
