#!/usr/bin/env python3
"""How far transformers' own bf16 run drifts from its fp32 run on the same prompt.

Our chapters compare a bf16 engine with an fp32 reference. This measures the drift that
bf16 alone causes in transformers, with the same metric as our `--check` lines
(max abs error / largest |fp32 value|), so that our limits can be judged against it.

    python3 hf_bf16_drift.py --model DIR --prompt-ids "128000 ..." [--prompt-ids "..."]
"""

import argparse

import torch
from transformers import LlamaForCausalLM


def relative(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return ((ours.float() - reference.float()).abs().max() / reference.float().abs().max()).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompt-ids", required=True, action="append")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    prompts = [torch.tensor([[int(t) for t in text.split()]], device=device) for text in args.prompt_ids]
    outputs = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = LlamaForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
        with torch.no_grad():
            outputs[dtype] = [model(ids, output_hidden_states=True) for ids in prompts]
        del model
    for index, (fp32, bf16) in enumerate(zip(outputs[torch.float32], outputs[torch.bfloat16])):
        layer0 = relative(bf16.hidden_states[1], fp32.hidden_states[1])
        final = relative(bf16.hidden_states[-1], fp32.hidden_states[-1])
        logits = relative(bf16.logits[0, -1], fp32.logits[0, -1])
        print(
            f"prompt {index} ({prompts[index].shape[1]} tokens): transformers bf16 vs fp32, relative error: "
            f"after layer 0 {layer0:.3e}, final hidden states {final:.3e}, last-position logits {logits:.3e}"
        )


if __name__ == "__main__":
    main()
