"""Hugging Face transformers on the benchmark's workloads, for `cargo x bench`.

Runs the requests of the workloads file that `bench workloads` wrote (token ids and
budgets) through `model.generate()`: bf16, greedy, every request generating exactly its
budget (`min_new_tokens` = `max_new_tokens`, so end tokens cannot stop it). Writes the same
JSON as the bench binary (see shared/bench/src/record.rs), rewritten after every figure so
that a run stopped by a time limit keeps what it finished.

Modes:
  eager     transformers as most people call it: a dynamic cache, no compilation.
  compiled  a static cache, which makes generate() compile the model's forward pass with
            torch.compile (mode "reduce-overhead": CUDA graphs) on a GPU.
  graph     not generate(): one decode step's matrix products alone (every layer's seven
            projections and the LM head, the model's own weights) as a chain of cuBLAS
            calls captured in one CUDA graph, at batch 1 and 32. What a careful PyTorch
            engineer's decode step would cost if attention, norms and launches were free.
"""

import argparse
import json
import os
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--workloads", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--mode", choices=["eager", "compiled", "graph"], required=True)
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each figure, after a warm-up")
    parser.add_argument("--device", default="cuda", help="cpu only to try the script on a tiny model")
    parser.add_argument(
        "--skip-batches", action="store_true", help="measure single-sequence decode and prefill only"
    )
    return parser.parse_args()


class Part:
    """One system's measurements, written as the bench binary writes them."""

    def __init__(self, system, mode, out):
        self.data = {"system": system, "mode": mode, "environment": {}, "measurements": []}
        self.out = out

    def note(self, key, value):
        self.data["environment"][key] = value
        self.write()

    def push(self, figure, unit, runs, detail):
        self.add(figure, unit, statistics.median(runs), runs, detail)

    def derived(self, figure, unit, value, detail):
        self.add(figure, unit, value, [], detail)

    def add(self, figure, unit, value, runs, detail):
        entry = {"figure": figure, "value": value, "unit": unit, "runs": runs, "detail": detail}
        self.data["measurements"].append(entry)
        print(f"hf_bench: {self.data['system']} [{self.data['mode']}] {figure} = {value:.4f} {unit} ({detail})", flush=True)
        self.write()

    def write(self):
        with open(self.out + ".tmp", "w") as f:
            json.dump(self.data, f, indent=2)
        os.replace(self.out + ".tmp", self.out)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def timed(device, work):
    """Seconds `work()` takes, the GPU's queue drained before and after."""
    sync(device)
    start = time.perf_counter()
    work()
    sync(device)
    return time.perf_counter() - start


def repeat(runs, measure):
    measure()  # warm-up
    return [measure() for _ in range(runs)]


class Memory:
    """Device memory taken since the start, sampled after each phase (as the bench binary does)."""

    def __init__(self, device):
        self.device = device
        self.baseline = self.free()
        self.lowest = self.baseline

    def free(self):
        return torch.cuda.mem_get_info()[0] if self.device == "cuda" else 0

    def sample(self):
        self.lowest = min(self.lowest, self.free())

    def peak_gib(self):
        return (self.baseline - self.lowest) / 2**30


def load(args, part, memory):
    def load_once():
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to(args.device)
        model.eval()
        return model

    seconds = []
    model = None
    for run in range(args.runs + 1):
        del model
        model = None
        if args.device == "cuda":
            torch.cuda.empty_cache()
        start = time.perf_counter()
        model = load_once()
        sync(args.device)
        if run > 0:
            seconds.append(time.perf_counter() - start)
    memory.sample()
    tensor_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    part.push("load_s", "s", seconds, "from_pretrained(dtype=bfloat16).to('cuda'); page cache warm")
    rate = tensor_bytes / 1e9 / statistics.median(seconds)
    part.derived("load_gb_per_s", "GB/s", rate, f"{tensor_bytes / 1e9:.2f} GB of parameters")
    return model


def generator(model, mode, device):
    """A function running one batch of prompts (all of one length or left-padded) to `new` tokens each."""
    extra = {"cache_implementation": "static"} if mode == "compiled" else {}

    def run(prompts, new):
        longest = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), longest), dtype=torch.long)
        mask = torch.zeros((len(prompts), longest), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, longest - len(prompt) :] = torch.tensor(prompt)
            mask[row, longest - len(prompt) :] = 1
        with torch.no_grad():
            out = model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
                **extra,
            )
        assert out.shape[1] == longest + new, f"generated {out.shape[1] - longest} tokens, asked for {new}"

    return run


def measure_generate(args, model, workloads, part, memory):
    run = generator(model, args.mode, args.device)
    single = workloads["single"]
    prompt, new = single["prompt"], single["new_tokens"]
    first = repeat(args.runs, lambda: timed(args.device, lambda: run([prompt], 1)) * 1e3)
    whole = repeat(args.runs, lambda: timed(args.device, lambda: run([prompt], new)) * 1e3)
    memory.sample()
    what = f"prompt {len(prompt)}, {new} generated"
    step = (statistics.median(whole) - statistics.median(first)) / (new - 1)
    part.derived("decode_step_ms", "ms", step, f"{what}: (generate {new} - generate 1) / {new - 1}, medians")
    part.derived("decode_tokens_per_s", "tokens/s", 1e3 / step, "1 / decode_step_ms")
    part.push("ttft_ms", "ms", first, f"{what}: generate(max_new_tokens=1)")
    part.push("single_generate_ms", "ms", whole, f"{what}: the whole generate() call")

    prefill = workloads["prefill"]["prompt"]
    times = repeat(args.runs, lambda: timed(args.device, lambda: run([prefill], 1)) * 1e3)
    memory.sample()
    part.push("prefill_ms", "ms", times, f"one {len(prefill)}-token prompt to its first token")
    rate = len(prefill) / (statistics.median(times) / 1e3)
    part.derived("prefill_tokens_per_s", "tokens/s", rate, "prompt tokens / prefill_ms")

    if not args.skip_batches:
        for batch in workloads["batches"]:
            requests = batch["requests"]
            prompts = [r["prompt"] for r in requests]
            budget = max(r["new_tokens"] for r in requests)
            generated = sum(r["new_tokens"] for r in requests)
            # A full warm-up: a shorter one leaves the first timed run several times slower
            # (memory for the longer cache; in compiled mode, a compilation for its length).
            run(prompts, budget)
            rates = [generated / timed(args.device, lambda: run(prompts, budget)) for _ in range(args.runs)]
            memory.sample()
            if len({len(p) for p in prompts}) == 1 and len({r["new_tokens"] for r in requests}) == 1:
                how = f"{len(requests)} requests in one generate() call"
            else:
                how = (
                    f"{len(requests)} requests in one generate() call, left-padded, all run to the largest budget "
                    f"({budget}); only each request's own budget counts as generated"
                )
            part.push(f"throughput_{batch['name']}", "tokens/s", rates, how + "; generated tokens / wall time")
    part.derived("peak_memory_gib", "GiB", memory.peak_gib(), "device memory taken from the start of the run")
    if args.mode == "compiled":
        # Whether torch.compile really ran, rather than generate() quietly staying eager.
        try:
            part.note("compiled_graphs", int(torch._dynamo.utils.counters["stats"]["unique_graphs"]))
        except Exception as error:  # the counter's place is not a stable API
            part.note("compiled_graphs", f"unknown ({error})")


@torch.no_grad()
def measure_graph(args, model, part):
    """One decode step's matrix products as a CUDA graph of cuBLAS calls."""
    layers = model.model.layers
    head = model.lm_head.weight
    hidden = model.config.hidden_size
    for batch in (1, 32):
        x = torch.randn(batch, hidden, dtype=torch.bfloat16, device=args.device)

        def step():
            h = x
            for layer in layers:
                attn, mlp = layer.self_attn, layer.mlp
                q = h @ attn.q_proj.weight.T
                h @ attn.k_proj.weight.T
                h @ attn.v_proj.weight.T
                o = q @ attn.o_proj.weight.T  # attention's output has q's shape; attention itself is left out
                gate = o @ mlp.gate_proj.weight.T
                o @ mlp.up_proj.weight.T
                h = gate @ mlp.down_proj.weight.T
            return h @ head.T

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                step()  # cuBLAS chooses its kernels and workspaces before capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()

        def replay_ms(replays=50):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / replays

        runs = repeat(args.runs + 2, replay_ms)
        figure = "decode_step_ms" if batch == 1 else f"decode_step_ms_batch_{batch}"
        detail = f"batch {batch}: 7 projections per layer and the LM head as cuBLAS calls in one CUDA graph"
        part.push(figure, "ms", runs, detail)


def main():
    args = parse_args()
    with open(args.workloads) as f:
        workloads = json.load(f)
    system = "torch-gemv-graph" if args.mode == "graph" else "transformers"
    mode = {"eager": "eager", "compiled": "static cache + torch.compile", "graph": "CUDA graph"}[args.mode]
    if args.mode == "compiled" and args.device != "cuda":
        mode += " (not compiled: generate() compiles on a GPU only)"
    part = Part(system, mode, args.out)
    part.note("torch", torch.__version__)
    import transformers

    part.note("transformers", transformers.__version__)
    transformers.utils.logging.disable_progress_bar()
    if args.device == "cuda":
        part.note("gpu", torch.cuda.get_device_name())
    memory = Memory(args.device)
    if args.mode == "graph":
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to(args.device)
        measure_graph(args, model, part)
    else:
        model = load(args, part, memory)
        measure_generate(args, model, workloads, part, memory)


if __name__ == "__main__":
    main()
