#!/usr/bin/env python3
"""How often Hugging Face transformers itself, run in bfloat16 on the GPU, continues a prompt
greedily as its own float32 run does: the bar that any bf16 engine faces on the generated
checkpoints for issue 6's "identical greedy continuations (32 tokens) on >= 95% of prompts"
(our GPU backend's counts are gpu_hf_parity_test's; docs/gpu.md puts the two side by side).

Usage (on a GPU host with PyTorch and transformers; no network):

    python3 bench/hf_bf16_greedy.py GOLDEN_DIR CHECKPOINTS_DIR [GOLDEN_DIR CHECKPOINTS_DIR ...]

GOLDEN_DIR holds a golden.json written by tests/data/golden/make_golden.py (or
tests/data/golden_trained/make_trained.py): per preset, prompts and their 32-token greedy
continuations recorded in float32 with eager attention on a CPU. CHECKPOINTS_DIR has one
sub-directory per preset, as `tokenselect make-model --preset P [--init hf] --out DIR/P` writes
them (tests/data/golden_trained holds its checkpoint itself); a checkpoint whose SHA-256 differs
from the manifest's is refused.

For every preset and prompt it runs greedy continuations (make_golden.py's: argmax, lowest id
on ties, with a KV cache) on cuda in float32 (eager), bfloat16 (eager) and bfloat16 (sdpa), and
counts those identical to the recorded one. Where one parts, it prints the step and the
float32 model's logit gap between the recorded pick and the other one, over the RMS of those
logits: a near-tie is a few percent of it or less.
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

# The goldens' own greedy continuation and checkpoint hash (the recording script's).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "data", "golden"))
from make_golden import greedy, sha256  # noqa: E402

RUNS = [("fp32 eager", torch.float32, "eager"), ("bf16 eager", torch.bfloat16, "eager"),
        ("bf16 sdpa", torch.bfloat16, "sdpa")]


@torch.no_grad()
def gap_at(reference, ids, recorded, step, other):
    """The float32 model's logit of the recorded pick minus that of `other` at `step`, over the
    RMS of its logits there."""
    x = torch.tensor([ids + recorded[:step]], device="cuda")
    logits = reference(input_ids=x, use_cache=False).logits[0, -1].double()
    rms = float(logits.pow(2).mean().sqrt())
    return float(logits[recorded[step]] - logits[other]) / rms


def main(pairs):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    transformers.utils.logging.disable_progress_bar()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}")
    table = []
    for golden_dir, ckpt_root in pairs:
        manifest = json.load(open(os.path.join(golden_dir, "golden.json")))
        steps = manifest["greedy_tokens"]
        totals = {name: 0 for name, _, _ in RUNS}
        prompts = 0
        for preset, entry in sorted(manifest["presets"].items()):
            path = os.path.join(ckpt_root, preset)
            got = sha256(os.path.join(path, "model.safetensors"))
            if got != entry["safetensors_sha256"]:
                sys.exit(f"{path}: checkpoint differs from {golden_dir}'s ({got})")
            models = {name: AutoModelForCausalLM.from_pretrained(
                path, dtype=dtype, attn_implementation=attn).to("cuda").eval()
                for name, dtype, attn in RUNS}
            for p in entry["prompts"]:
                prompts += 1
                ids, recorded = p["ids"], p["greedy"]
                x = torch.tensor([ids], device="cuda")
                line = []
                for name, _, _ in RUNS:
                    cont = greedy(models[name], x, steps)
                    if cont == recorded:
                        totals[name] += 1
                        continue
                    step = next(i for i in range(steps) if cont[i] != recorded[i])
                    gap = gap_at(models["fp32 eager"], ids, recorded, step, cont[step])
                    line.append(f"{name} parts at step {step} (fp32 gap {100 * gap:.2f}% of RMS)")
                if line:
                    print(f"  {golden_dir} {preset} length {len(ids)}: " + "; ".join(line))
            del models
            torch.cuda.empty_cache()
        table.append((golden_dir, prompts, totals))
    print("\nidentical 32-token greedy continuations (against the recorded fp32 CPU ones):")
    print(f"{'goldens':34s} " + " ".join(f"{name:>12s}" for name, _, _ in RUNS))
    for golden_dir, prompts, totals in table:
        print(f"{golden_dir:34s} " +
              " ".join(f"{f'{totals[name]} of {prompts}':>12s}" for name, _, _ in RUNS))


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit(__doc__)
    main(list(zip(args[0::2], args[1::2])))
