#!/usr/bin/env python3
"""Records Hugging Face transformers reference outputs for our generated checkpoints.

Run on a host with PyTorch and transformers (no network needed):

    python3 tests/data/golden/make_golden.py CHECKPOINTS_DIR OUT_DIR

CHECKPOINTS_DIR holds one sub-directory per preset, written by
`tokenselect make-model --preset NAME --out CHECKPOINTS_DIR/NAME` (deterministic, so CI
regenerates byte-identical files). tests/data/golden was made from the default weights;
tests/data/golden_hf from `make-model --init hf` (transformers' own N(0, 0.02) init), on an H200
host's CPU with transformers 5.17 / torch 2.11 (2026-11-21). For every preset and every prompt length in PROMPT_LENGTHS it
loads the checkpoint in float32 with eager attention, runs the prompt (token ids drawn from a
fixed seed, stored in the output so the C++ test needs no tokenizer) and records:
  - full-vocabulary logits at a few positions (the last one included) -> <preset>.logits.bin,
    little-endian float32, rows in the order the manifest lists them;
  - a 32-token greedy continuation (argmax, lowest id on ties, ignoring EOS);
  - the SHA-256 of model.safetensors, so a test can tell "checkpoint changed" from "forward wrong".
The manifest is OUT_DIR/golden.json. The C++ side is tests/unit/engine/generation/
hf_parity_test.cc (CPU) and tests/gpu/hf_parity_test.cc (GPU);
tests/data/golden_trained/make_trained.py records the same format for a trained checkpoint.
"""
import hashlib
import json
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

PROMPT_LENGTHS = [1, 17, 128, 515, 1024]
GREEDY_TOKENS = 32
SEED = 20261121


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def positions_for(length):
    picks = {length - 1, 0, length // 2, (length * 3) // 4}
    return sorted(p for p in picks if 0 <= p < length)


@torch.no_grad()
def greedy(model, ids, steps):
    """The greedy continuation (`steps` tokens) of ids [1, length] with a KV cache, on ids'
    device (bench/hf_bf16_greedy.py runs it on the GPU)."""
    out = model(input_ids=ids, use_cache=True)
    past = out.past_key_values
    tokens = []
    logits = out.logits[0, -1]
    for _ in range(steps):
        # argmax returns the first maximal index: the lowest id on ties.
        nxt = int(torch.argmax(logits).item())
        tokens.append(nxt)
        out = model(input_ids=torch.tensor([[nxt]], device=ids.device), past_key_values=past,
                    use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1]
    return tokens


@torch.no_grad()
def main(ckpt_root, out_dir):
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    os.makedirs(out_dir, exist_ok=True)
    import transformers
    manifest = {"transformers": transformers.__version__, "torch": torch.__version__,
                "greedy_tokens": GREEDY_TOKENS, "presets": {}}
    rng = np.random.default_rng(SEED)
    for preset in sorted(os.listdir(ckpt_root)):
        path = os.path.join(ckpt_root, preset)
        if not os.path.isfile(os.path.join(path, "config.json")):
            continue
        print(f"[golden] {preset}: loading", flush=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                     attn_implementation="eager")
        model.eval()
        vocab = model.config.vocab_size
        entry = {"safetensors_sha256": sha256(os.path.join(path, "model.safetensors")),
                 "vocab_size": vocab, "prompts": []}
        rows = []
        for length in PROMPT_LENGTHS:
            ids = rng.integers(0, vocab, size=length).tolist()
            x = torch.tensor([ids])
            logits = model(input_ids=x, use_cache=False).logits[0]  # [length, vocab]
            pos = positions_for(length)
            for p in pos:
                rows.append(logits[p].float().numpy().astype("<f4"))
            cont = greedy(model, x, GREEDY_TOKENS)
            entry["prompts"].append({"ids": ids, "logit_positions": pos, "greedy": cont})
            print(f"[golden] {preset}: length {length} done, greedy {cont[:8]}...", flush=True)
        np.concatenate(rows).tofile(os.path.join(out_dir, f"{preset}.logits.bin"))
        manifest["presets"][preset] = entry
        del model
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"[golden] wrote {out_dir}/golden.json", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
