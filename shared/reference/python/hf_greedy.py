#!/usr/bin/env python3
"""Greedy decoding with Hugging Face transformers, for comparison with our engine.

Prints one JSON object per line, one per dtype and prompt:
  {"dtype": "bfloat16", "prompt": 0, "device": "cuda", "greedy_ids": [...], "last_logits_top": [[id, logit], ...]}

    python3 hf_greedy.py --model DIR --prompt-ids "128000 9906 11" [--prompt-ids "..."] \
        --max-new-tokens 32 --dtypes bf16 fp32
"""

import argparse
import json

import torch
from transformers import LlamaForCausalLM

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompt-ids", required=True, action="append", help="space-separated token ids (repeatable)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=sorted(DTYPES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    prompts = [torch.tensor([[int(t) for t in text.split()]], device=args.device) for text in args.prompt_ids]
    for name in args.dtypes:
        model = LlamaForCausalLM.from_pretrained(args.model, dtype=DTYPES[name]).to(args.device)
        model.eval()
        for index, ids in enumerate(prompts):
            with torch.no_grad():
                logits = model(ids).logits[0, -1].float()
                generated = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=args.max_new_tokens,
                    do_sample=False,
                )[0, ids.shape[1]:].tolist()
            top = torch.topk(logits, 10)
            print(json.dumps({
                "dtype": str(DTYPES[name]).removeprefix("torch."),
                "prompt": index,
                "device": args.device,
                "greedy_ids": generated,
                "last_logits_top": [[i, round(v, 5)] for i, v in zip(top.indices.tolist(), top.values.tolist())],
            }), flush=True)
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
