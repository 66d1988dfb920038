#!/usr/bin/env python3
"""How often Hugging Face transformers itself, run in bfloat16 on the GPU, continues a prompt
greedily as its own float32 run does: the bar that any bf16 engine faces on the generated
checkpoints for issue 6's "identical greedy continuations (32 tokens) on >= 95% of prompts"
(our GPU backend's counts are gpu_hf_parity_test's; docs/gpu.md puts the two side by side).

Usage (on a GPU host with PyTorch and transformers; no network):

    python3 bench/hf_bf16_greedy.py [--ours FILE] GOLDEN_DIR CHECKPOINTS_DIR [GOLDEN_DIR CHECKPOINTS_DIR ...]

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

Then it counts how often two bf16 runs agree with each other: transformers' eager and sdpa
attention, and, with --ours FILE (the JSON lines gpu_hf_parity_test appends to the file named by
TS_HF_PARITY_CONTINUATIONS, run with the same GOLDEN_DIR spellings), our GPU backend against
either. Two bf16 implementations part wherever a near-tie falls within their rounding, so these
counts say how much of the gap to float32 is precision rather than a wrong forward pass.
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
# The pairs of bf16 runs whose continuations are compared with each other ("ours": --ours).
AGREEMENT = [("bf16 eager", "bf16 sdpa"), ("ours", "bf16 eager"), ("ours", "bf16 sdpa")]


@torch.no_grad()
def gap_at(reference, ids, recorded, step, other):
    """The float32 model's logit of the recorded pick minus that of `other` at `step`, over the
    RMS of its logits there."""
    x = torch.tensor([ids + recorded[:step]], device="cuda")
    logits = reference(input_ids=x, use_cache=False).logits[0, -1].double()
    rms = float(logits.pow(2).mean().sqrt())
    return float(logits[recorded[step]] - logits[other]) / rms


def load_ours(path):
    """{(golden_dir, preset, prompt index): continuation} from gpu_hf_parity_test's lines."""
    ours = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            ours[(os.path.normpath(r["golden"]), r["preset"], r["prompt"])] = r["greedy"]
    return ours


def main(pairs, ours):
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
        agree = {pair: 0 for pair in AGREEMENT}
        prompts = 0
        for preset, entry in sorted(manifest["presets"].items()):
            path = os.path.join(ckpt_root, preset)
            got = sha256(os.path.join(path, "model.safetensors"))
            if got != entry["safetensors_sha256"]:
                sys.exit(f"{path}: checkpoint differs from {golden_dir}'s ({got})")
            models = {name: AutoModelForCausalLM.from_pretrained(
                path, dtype=dtype, attn_implementation=attn).to("cuda").eval()
                for name, dtype, attn in RUNS}
            for index, p in enumerate(entry["prompts"]):
                prompts += 1
                ids, recorded = p["ids"], p["greedy"]
                x = torch.tensor([ids], device="cuda")
                line = []
                conts = {"ours": ours.get((os.path.normpath(golden_dir), preset, index))}
                if ours and conts["ours"] is None:
                    print(f"  --ours has no continuation for {golden_dir} {preset} prompt {index}")
                for name, _, _ in RUNS:
                    cont = greedy(models[name], x, steps)
                    conts[name] = cont
                    if cont == recorded:
                        totals[name] += 1
                        continue
                    step = next(i for i in range(steps) if cont[i] != recorded[i])
                    gap = gap_at(models["fp32 eager"], ids, recorded, step, cont[step])
                    line.append(f"{name} parts at step {step} (fp32 gap {100 * gap:.2f}% of RMS)")
                for a, b in AGREEMENT:
                    agree[(a, b)] += conts[a] is not None and conts[a] == conts[b]
                if line:
                    print(f"  {golden_dir} {preset} length {len(ids)}: " + "; ".join(line))
            del models
            torch.cuda.empty_cache()
        table.append((golden_dir, prompts, totals, agree))
    print("\nidentical 32-token greedy continuations (against the recorded fp32 CPU ones):")
    print(f"{'goldens':34s} " + " ".join(f"{name:>12s}" for name, _, _ in RUNS))
    for golden_dir, prompts, totals, _ in table:
        print(f"{golden_dir:34s} " +
              " ".join(f"{f'{totals[name]} of {prompts}':>12s}" for name, _, _ in RUNS))
    pairs_shown = [pair for pair in AGREEMENT if ours or "ours" not in pair]
    print("\nidentical 32-token greedy continuations, bf16 against bf16:")
    print(f"{'goldens':34s} " + " ".join(f"{a + ' = ' + b:>22s}" for a, b in pairs_shown))
    for golden_dir, prompts, _, agree in table:
        print(f"{golden_dir:34s} " +
              " ".join(f"{f'{agree[pair]} of {prompts}':>22s}" for pair in pairs_shown))


if __name__ == "__main__":
    args = sys.argv[1:]
    ours = {}
    if args[:1] == ["--ours"] and len(args) > 1:
        ours = load_ours(args[1])
        args = args[2:]
    if not args or len(args) % 2:
        sys.exit(__doc__)
    main(list(zip(args[0::2], args[1::2])), ours)
