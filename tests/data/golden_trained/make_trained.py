#!/usr/bin/env python3
"""Trains the small "topics" checkpoint and records Hugging Face transformers goldens for it.

Run on a host with PyTorch, transformers and safetensors (no network needed; on an H100 the
training takes 2-3 minutes and recording the goldens on the CPU some minutes more):

    python3 tests/data/golden_trained/make_trained.py CHECKPOINT_DIR OUT_DIR

Why a trained checkpoint: the generated checkpoints (make-model) have random weights, so their
next-token distributions are nearly flat (--init hf) or chaotic (the default init). On them a
32-token greedy continuation in bf16 flips wherever the top two logits sit closer than the bf16
rounding, which says little about the forward pass. A trained model has margins between its
top candidates, as real models do. This one is trained on a synthetic language whose next token
depends on the context through attention:

  - a document is a topic marker (token 1 + topic, 4 topics) followed by content tokens
    (ids 5 .. 506, the regular part of make-model's 512-token vocabulary);
  - each topic has its own Markov chain: every content token has 4 successors, drawn per topic,
    taken with probabilities 0.55 / 0.22 / 0.13 / 0.10 (and 4 start tokens after the marker,
    the same probabilities). The current token alone does not say which chain is running: the
    model has to find the topic in the context (the marker, or the transitions seen so far), so
    its attention carries the prediction.

The greedy choice has a margin of about log(0.55 / 0.22) = 0.92 nats once the topic is known.

CHECKPOINT_DIR holds config.json, generation_config.json and the tokenizer files (committed; the
shape is config.json's: tied embeddings and a 256-wide MLP keep the committed weights at 0.92M
parameters, 1.8 MB in bf16, under the project's 2 MB line for committed files). The script
trains with a fixed seed, writes CHECKPOINT_DIR/model.safetensors (bfloat16, Hugging Face
tensor names), reloads it with transformers in float32 and eager attention on the CPU, and records
into OUT_DIR what make_golden.py records (golden.json and llama-topics.logits.bin, the same
format) for 40 prompts drawn from the same language: 4 topics x lengths 1 .. 1024. golden.json
also gets, per prompt, the smallest gap between the top two logits along the greedy continuation
(`greedy_min_gap`), and the training summary.

Training on a GPU is not bit-reproducible (two runs on one H100 differed in the last bits), so
the committed model.safetensors is the reference: a rerun replaces it and the goldens together.
"""
import json
import math
import os
import sys
import time

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden"))
from make_golden import GREEDY_TOKENS, positions_for, sha256  # noqa: E402

PRESET = "llama-topics"
TOPICS = 4
FIRST_MARKER = 1
FIRST_CONTENT = FIRST_MARKER + TOPICS  # 5
END_CONTENT = 507                      # make-model's special tokens start here
PROBS = np.array([0.55, 0.22, 0.13, 0.10])
SEED = 20261122
TRAIN_STEPS = 3600
BATCH = 32
TRAIN_LENGTH = 1088  # the longest prompt (1024) and its 32-token continuation, with room
PROMPT_LENGTHS = [1, 2, 9, 17, 64, 128, 257, 515, 777, 1024]


class Language:
    """The topic Markov chains."""

    def __init__(self, rng):
        content = np.arange(FIRST_CONTENT, END_CONTENT)
        self.succ = np.zeros((TOPICS, END_CONTENT, len(PROBS)), dtype=np.int64)
        self.start = np.zeros((TOPICS, len(PROBS)), dtype=np.int64)
        for t in range(TOPICS):
            self.start[t] = rng.choice(content, len(PROBS), replace=False)
            for x in content:
                self.succ[t, x] = rng.choice(content, len(PROBS), replace=False)

    def sample(self, rng, topics, length):
        """Documents of `length` tokens, one per entry of `topics`."""
        batch = len(topics)
        docs = np.zeros((batch, length), dtype=np.int64)
        docs[:, 0] = FIRST_MARKER + topics
        picks = rng.choice(len(PROBS), size=(batch, length), p=PROBS)
        if length > 1:
            cur = self.start[topics, picks[:, 1]]
            docs[:, 1] = cur
            for i in range(2, length):
                cur = self.succ[topics, cur, picks[:, i]]
                docs[:, i] = cur
        return docs

    def entropy(self):
        """Nats per predicted token of the language (every prediction is a 4-way choice)."""
        return float(-(PROBS * np.log(PROBS)).sum())


def train(model, language, device, log):
    rng = np.random.default_rng(SEED + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.01)
    warmup = 100

    def lr_at(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, TRAIN_STEPS - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    losses = []
    t0 = time.time()
    for step in range(TRAIN_STEPS):
        docs = language.sample(rng, rng.integers(0, TOPICS, BATCH), TRAIN_LENGTH)
        x = torch.from_numpy(docs).to(device)
        out = model(input_ids=x, labels=x, use_cache=False)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(out.loss))
        if step % 200 == 0 or step == TRAIN_STEPS - 1:
            log(f"[train] step {step} loss {np.mean(losses[-50:]):.4f} "
                f"(floor {language.entropy():.4f}) {time.time() - t0:.0f} s")
    model.eval()
    return float(np.mean(losses[-100:]))


@torch.no_grad()
def greedy_with_gaps(model, ids, steps):
    """make_golden.py's greedy continuation, plus the top-1 minus top-2 logit at each step."""
    out = model(input_ids=ids, use_cache=True)
    past = out.past_key_values
    tokens, gaps = [], []
    logits = out.logits[0, -1]
    for _ in range(steps):
        top = torch.topk(logits, 2).values
        gaps.append(float(top[0] - top[1]))
        nxt = int(torch.argmax(logits).item())  # the lowest id on ties
        tokens.append(nxt)
        out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1]
    return tokens, gaps


def main(ckpt_dir, out_dir):
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    torch.manual_seed(SEED)
    language = Language(np.random.default_rng(SEED))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = AutoConfig.from_pretrained(ckpt_dir)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model = model.float().to(device)
    final_loss = train(model, language, device, log)
    weights = {name: p.detach().to("cpu", torch.bfloat16).contiguous()
               for name, p in model.named_parameters()}
    path = os.path.join(ckpt_dir, "model.safetensors")
    save_file(weights, path, metadata={"format": "pt"})
    log(f"[train] wrote {path}: {len(weights)} tensors, "
        f"{sum(w.numel() for w in weights.values())} parameters")
    del model

    # The reference: the stored bf16 weights in float32, eager attention, on the CPU.
    torch.use_deterministic_algorithms(True)
    ref = AutoModelForCausalLM.from_pretrained(ckpt_dir, dtype=torch.float32,
                                               attn_implementation="eager")
    ref.eval()
    vocab = ref.config.vocab_size
    entry = {"safetensors_sha256": sha256(path), "vocab_size": vocab, "prompts": []}
    rows = []
    rng = np.random.default_rng(SEED + 2)
    agree = total = 0
    for length in PROMPT_LENGTHS:
        for topic in range(TOPICS):
            ids = language.sample(rng, np.array([topic]), length)[0].tolist()
            x = torch.tensor([ids])
            with torch.no_grad():
                logits = ref(input_ids=x, use_cache=False).logits[0]
            pos = positions_for(length)
            for p in pos:
                rows.append(logits[p].float().numpy().astype("<f4"))
            # How often the model's argmax is the language's most likely next token.
            for p in range(length):
                want = int(language.start[topic, 0] if p == 0
                           else language.succ[topic, ids[p], 0])
                agree += int(int(torch.argmax(logits[p]).item()) == want)
                total += 1
            cont, gaps = greedy_with_gaps(ref, x, GREEDY_TOKENS)
            entry["prompts"].append({"ids": ids, "logit_positions": pos, "greedy": cont,
                                     "greedy_min_gap": min(gaps)})
            log(f"[golden] length {length} topic {topic}: greedy {cont[:6]}..., "
                f"smallest top-2 gap {min(gaps):.3f}")
    np.concatenate(rows).tofile(os.path.join(out_dir, f"{PRESET}.logits.bin"))
    gaps = sorted(p["greedy_min_gap"] for p in entry["prompts"])
    log(f"[golden] argmax = the language's likeliest token at {agree} of {total} prompt "
        f"positions; smallest top-2 gap per continuation: min {gaps[0]:.3f}, "
        f"median {gaps[len(gaps) // 2]:.3f}")
    manifest = {"transformers": transformers.__version__, "torch": torch.__version__,
                "greedy_tokens": GREEDY_TOKENS,
                "training": {"steps": TRAIN_STEPS, "batch": BATCH, "length": TRAIN_LENGTH,
                             "seed": SEED, "final_loss": final_loss,
                             "loss_floor": language.entropy(),
                             "argmax_is_likeliest": [agree, total]},
                "presets": {PRESET: entry}}
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    with open(os.path.join(out_dir, "train.log"), "w") as f:
        f.write("\n".join(lines) + "\n")
    log(f"[golden] wrote {out_dir}/golden.json")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
