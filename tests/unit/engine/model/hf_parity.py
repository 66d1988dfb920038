#!/usr/bin/env python3
"""Checks the fixtures of hf_parity_fixture_test.cc against Hugging Face transformers.

For each case folder: loads the checkpoint with AutoModelForCausalLM.from_pretrained in fp32
(no missing, unexpected or mismatched weights allowed), compares its prompt logits with
engine::Model's (logits.f32) and its greedy continuation with ours (prompt.json). Exits 1 on any
mismatch. Needs torch and transformers (not installed on the CPU machines).
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM


def check(case_dir):
    with open(os.path.join(case_dir, "prompt.json")) as f:
        fixture = json.load(f)
    config = AutoConfig.from_pretrained(case_dir)
    model, info = AutoModelForCausalLM.from_pretrained(
        case_dir, dtype=torch.float32, output_loading_info=True)
    model.eval()
    problems = [f"{k}: {v}" for k, v in info.items() if v]
    prompt = torch.tensor([fixture["prompt"]])
    with torch.no_grad():
        logits = model(prompt).logits[0].numpy()
    ours = np.fromfile(os.path.join(case_dir, "logits.f32"), dtype=np.float32)
    ours = ours.reshape(logits.shape)
    scale = max(1.0, float(np.abs(logits).max()))
    rel = float(np.abs(logits - ours).max()) / scale
    if rel > 1e-4:
        problems.append(f"logits differ: max relative error {rel:.2e}")
    # Greedy by hand (generate() would stop at, or with min_new_tokens suppress, eos).
    ids = prompt
    with torch.no_grad():
        for _ in fixture["greedy"]:
            next_id = model(ids).logits[0, -1].argmax().reshape(1, 1)
            ids = torch.cat([ids, next_id], dim=1)
    theirs = ids[0, prompt.shape[1]:].tolist()
    if theirs != fixture["greedy"]:
        problems.append(f"greedy differs:\n    hf   {theirs}\n    ours {fixture['greedy']}")
    print(f"{os.path.basename(case_dir)}: {type(model).__name__} ({config.model_type}), "
          f"logits max rel err {rel:.2e}, greedy {'same' if theirs == fixture['greedy'] else 'DIFFERENT'}")
    for p in problems:
        print("  PROBLEM " + p)
    return not problems


def main(root):
    torch.manual_seed(0)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    cases = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    results = [check(os.path.join(root, d)) for d in cases]
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if cases and all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
