#!/usr/bin/env python3
"""Builds the HF reference data for tests/unit/tokenizer/hf_parity_test.cc.

Usage:
    python3 tests/data/tokenizers/make_reference.py OUTPUT_DIR

Needs only Python 3 and the Hugging Face `tokenizers` package (tested with 0.23); no network.
Copy OUTPUT_DIR back to tests/data/tokenizers/reference/ and commit it.

What it does:
  1. Trains a byte-level BPE tokenizer (Llama-3 layout: Split(Llama-3 regex) + ByteLevel
     pre-tokenizer, ByteLevel decoder, <|begin_of_text|> template) on tokenizer/data/training_corpus.txt and
     writes OUTPUT_DIR/bytelevel/{tokenizer.json,tokenizer_config.json}.
  2. Trains a SentencePiece-style BPE (Llama-2 layout: Prepend/Replace normalizer, no
     pre-tokenizer, byte_fallback with all 256 <0xNN> tokens, <unk>/<s>/</s>, Replace/
     ByteFallback/Fuse/Strip decoder) and writes OUTPUT_DIR/sentencepiece/{...}.
  3. Derives variants of both by patching parts of their tokenizer.json (GPT-2 and Qwen2
     pre-tokenizers, Llama-3's ignore_merges, Metaspace pre-tokenizers and decoders, added
     tokens with lstrip/rstrip/single_word/normalized), and records the patches.
  4. Encodes every test case (each line of corpus_test.txt, groups of lines joined with
     different separators, and the whole file) with every variant, with and without special
     tokens, decodes the ids, splits the cases with the three supported regexes, and decodes
     pseudo-random id sequences; everything goes to OUTPUT_DIR/expected.json.

expected.json:
  tokenizers_version, python_version
  cases: [text, ...]
  variants: {name: {base: "bytelevel" | "sentencepiece",
                    patch: {top-level tokenizer.json key: replacement},
                    model_patch: {model key: replacement},
                    special_prefix / special_suffix: ids the post-processor adds,
                    ids: [[id, ...] per case]          (add_special_tokens=False),
                    ids_special: [null | [id, ...]]    (null: prefix + ids + suffix),
                    decoded_skip: [null | text]        (decode(ids_special, skip=True);
                                                        null: equals the case text),
                    decoded: [null | text]             (skip=False; null: equals decoded_skip),
                    random_decode: [{ids, text, text_skip}, ...]}}
  pretokenize: {gpt2 | llama3 | qwen2: {pattern, pieces: [[piece, ...] per case]}}
"""
import json
import os
import sys

import tokenizers
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS_TRAIN = os.path.join(HERE, "..", "..", "..", "tokenizer", "data", "training_corpus.txt")
CORPUS_TEST = os.path.join(HERE, "corpus_test.txt")

GPT2_PATTERN = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

BYTELEVEL_VOCAB = 4096
SENTENCEPIECE_VOCAB = 4000
BYTELEVEL_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                      "<|end_header_id|>", "<|eot_id|>"]
SP_SPECIALS = ["<unk>", "<s>", "</s>"]
METASPACE = "\u2581"


def log(message):
    print("[make_reference] " + message, flush=True)


def read_text(path):
    # newline="" keeps \r and splits nothing: the test lines contain \r, \x85 and \u2028.
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def write_json(path, value, indent=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(value, f, ensure_ascii=False, indent=indent, separators=(",", ":"))
        f.write("\n")
    log("wrote %s (%d bytes)" % (path, os.path.getsize(path)))


def train_bytelevel():
    log("training byte-level BPE (vocab %d)" % BYTELEVEL_VOCAB)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BYTELEVEL_VOCAB, min_frequency=0,
                                  special_tokens=BYTELEVEL_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([CORPUS_TRAIN], trainer)
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.TemplateProcessing(
        single=bos + " $A", pair=bos + " $A " + bos + " $B",
        special_tokens=[(bos, tok.token_to_id(bos))])
    data = json.loads(tok.to_str())
    log("byte-level: %d vocab, %d merges" % (len(data["model"]["vocab"]),
                                            len(data["model"]["merges"])))
    return data


def train_sentencepiece():
    log("training SentencePiece-style BPE (vocab %d)" % SENTENCEPIECE_VOCAB)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    # Train on words split at spaces (as SentencePiece does); the final file has Llama-2's
    # normalizer and no pre-tokenizer instead.
    tok.normalizer = normalizers.Replace(" ", METASPACE)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always",
                                                 split=True)
    trainer = trainers.BpeTrainer(vocab_size=SENTENCEPIECE_VOCAB - 256, min_frequency=0,
                                  special_tokens=SP_SPECIALS, limit_alphabet=220,
                                  show_progress=False)
    tok.train([CORPUS_TRAIN], trainer)
    data = json.loads(tok.to_str())
    trained = data["model"]["vocab"]
    # Llama-2 layout: <unk>, <s>, </s>, then <0x00>..<0xFF>, then the learned pieces.
    vocab = {t: i for i, t in enumerate(SP_SPECIALS)}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for token, _ in sorted(trained.items(), key=lambda kv: kv[1]):
        if token not in vocab:
            vocab[token] = len(vocab)
    model = data["model"]
    model["vocab"] = vocab
    model["byte_fallback"] = True
    model["fuse_unk"] = True
    model["unk_token"] = "<unk>"
    data["added_tokens"] = [
        {"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True} for t in SP_SPECIALS]
    data["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": METASPACE},
        {"type": "Replace", "pattern": {"String": " "}, "content": METASPACE}]}
    data["pre_tokenizer"] = None
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [vocab["<s>"]], "tokens": ["<s>"]}}}
    data["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": METASPACE}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    Tokenizer.from_str(json.dumps(data))  # must load
    log("sentencepiece: %d vocab, %d merges" % (len(vocab), len(model["merges"])))
    return data


def added(token_id, content, special, lstrip=False, rstrip=False, single_word=False,
          normalized=None):
    return {"id": token_id, "content": content, "single_word": single_word, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": (not special) if normalized is None else normalized,
            "special": special}


def make_variants(bytelevel, sentencepiece):
    """Each variant: base name, top-level replacements, model field replacements."""
    bl_next = max([t["id"] for t in bytelevel["added_tokens"]] +
                  list(bytelevel["model"]["vocab"].values())) + 1
    sp_next = len(sentencepiece["model"]["vocab"])
    byte_level_pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                      "use_regex": False}
    sp_decoder = sentencepiece["decoder"]
    return {
        "bytelevel": {"base": "bytelevel", "patch": {}, "model_patch": {}},
        "llama3_ignore_merges": {"base": "bytelevel", "patch": {},
                                 "model_patch": {"ignore_merges": True}},
        "gpt2": {"base": "bytelevel", "model_patch": {}, "patch": {
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                              "trim_offsets": True, "use_regex": True},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                               "trim_offsets": False, "use_regex": True},
            "added_tokens": bytelevel["added_tokens"] + [
                added(bl_next, "<mask>", True, lstrip=True),
                added(bl_next + 1, "lighthouse", False, single_word=True),
                added(bl_next + 2, " world", False, rstrip=True, normalized=False)]}},
        "gpt2_prefix_space": {"base": "bytelevel", "model_patch": {}, "patch": {
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True,
                              "trim_offsets": True, "use_regex": True},
            "post_processor": None}},
        "qwen2": {"base": "bytelevel", "model_patch": {}, "patch": {
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated",
                 "invert": False}, byte_level_pre]},
            "post_processor": None,
            "added_tokens": bytelevel["added_tokens"] + [
                added(bl_next, "<|endoftext|>", True), added(bl_next + 1, "<|im_start|>", True),
                added(bl_next + 2, "<|im_end|>", True)]}},
        "sentencepiece": {"base": "sentencepiece", "patch": {}, "model_patch": {}},
        "sentencepiece_normalized_added": {"base": "sentencepiece", "model_patch": {}, "patch": {
            "added_tokens": sentencepiece["added_tokens"] + [
                added(sp_next, "flour water", False),
                added(sp_next + 1, "<mask>", True, rstrip=True)]}},
        "metaspace": {"base": "sentencepiece", "model_patch": {}, "patch": {
            "normalizer": None,
            "pre_tokenizer": {"type": "Metaspace", "replacement": METASPACE,
                              "prepend_scheme": "first", "split": False},
            "decoder": sp_decoder}},
        "metaspace_split": {"base": "sentencepiece", "model_patch": {"fuse_unk": False},
                            "patch": {
            "normalizer": None,
            "pre_tokenizer": {"type": "Metaspace", "replacement": METASPACE,
                              "prepend_scheme": "always", "split": True},
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "ByteFallback"},
                {"type": "Metaspace", "replacement": METASPACE, "prepend_scheme": "always",
                 "split": True}]}}},
    }


def apply_variant(bases, variant):
    data = json.loads(json.dumps(bases[variant["base"]]))
    data.update(variant["patch"])
    data["model"].update(variant["model_patch"])
    return data


def test_cases():
    text = read_text(CORPUS_TEST)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    cases = list(lines)
    separators = ["\n", "\n\n", "\r\n", "\t", "  ", "\n \n", "", " \n\n\n"]
    for group, start in enumerate(range(0, len(lines), 9)):
        sep = separators[group % len(separators)]
        cases.append(sep.join(lines[start:start + 9]))
    cases.append(text)
    cases.append("")
    return cases


class Lcg:
    """A tiny deterministic generator (no `random` import needed)."""

    def __init__(self, seed):
        self.state = seed

    def next(self, bound):
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        return (self.state >> 33) % bound


def random_sequences(tok, data, seed):
    """Id sequences mixing ordinary tokens, byte tokens, specials and unknown ids."""
    rng = Lcg(seed)
    vocab = data["model"]["vocab"]
    size = max(list(vocab.values()) + [t["id"] for t in data["added_tokens"]]) + 1
    byte_ids = [vocab["<0x%02X>" % b] for b in range(256) if "<0x%02X>" % b in vocab]
    special_ids = [t["id"] for t in data["added_tokens"]]
    interesting = [i for t, i in vocab.items() if METASPACE in t or t.startswith("\u0120")]
    sequences = []
    for n in range(60):
        length = rng.next(24) + (1 if n % 10 else 0)
        seq = []
        for _ in range(length):
            kind = rng.next(10)
            if kind < 3 and byte_ids:
                # Bytes near UTF-8 lead/continuation values make valid and invalid runs.
                seq.append(byte_ids[[0x41, 0xC3, 0xA9, 0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x98,
                                     0x80, 0x20, 0xFF][rng.next(12)]])
            elif kind < 4 and special_ids:
                seq.append(special_ids[rng.next(len(special_ids))])
            elif kind < 6 and interesting:
                seq.append(interesting[rng.next(len(interesting))])
            elif kind < 7:
                seq.append(rng.next(size + 5))  # may be past the vocab
            else:
                seq.append(rng.next(size))
        try:
            text = tok.decode(seq, skip_special_tokens=False)
        except Exception as e:  # keep going: drop the ids past the vocab and retry
            log("decode of %s failed (%s); dropping unknown ids" % (seq, e))
            seq = [i for i in seq if i < size]
            text = tok.decode(seq, skip_special_tokens=False)
        sequences.append({"ids": seq, "text": text,
                          "text_skip": tok.decode(seq, skip_special_tokens=True)})
    return sequences


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_reference.py OUTPUT_DIR")
    out_dir = os.path.abspath(sys.argv[1])
    log("tokenizers %s, Python %s" % (tokenizers.__version__, sys.version.split()[0]))
    log("output directory: " + out_dir)
    for path in (CORPUS_TRAIN, CORPUS_TEST):
        if not os.path.exists(path):
            sys.exit("missing " + path)

    bases = {"bytelevel": train_bytelevel(), "sentencepiece": train_sentencepiece()}
    configs = {
        "bytelevel": {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                      "chat_template": "{{ bos_token }}{% for m in messages %}"
                                       "<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
                                       "\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}",
                      "model_max_length": 8192},
        "sentencepiece": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                          "add_bos_token": True, "add_eos_token": False,
                          "model_max_length": 4096},
    }
    for name, data in bases.items():
        write_json(os.path.join(out_dir, name, "tokenizer.json"), data)
        write_json(os.path.join(out_dir, name, "tokenizer_config.json"), configs[name], indent=2)

    variants = make_variants(bases["bytelevel"], bases["sentencepiece"])
    cases = test_cases()
    log("%d test cases" % len(cases))
    results = {}
    for index, (name, variant) in enumerate(variants.items()):
        data = apply_variant(bases, variant)
        if variant["patch"] or variant["model_patch"]:
            tok = Tokenizer.from_str(json.dumps(data))
        else:  # the committed file itself, as written
            tok = Tokenizer.from_file(os.path.join(out_dir, name, "tokenizer.json"))
        # To keep the file small, values that follow from others are null:
        #   ids_special: null when it is special_prefix + ids + special_suffix;
        #   decoded_skip: null when it equals the case text;
        #   decoded: null when it equals decoded_skip.
        prefix = tok.encode("", add_special_tokens=True).ids
        suffix = []
        if prefix:
            probe = tok.encode("a", add_special_tokens=True).ids
            plain = tok.encode("a", add_special_tokens=False).ids
            if probe[:len(prefix)] == prefix and probe[len(prefix):len(prefix) + len(plain)] == plain:
                suffix = probe[len(prefix) + len(plain):]
        ids, ids_special, decoded, decoded_skip = [], [], [], []
        for case in cases:
            plain = tok.encode(case, add_special_tokens=False).ids
            special = tok.encode(case, add_special_tokens=True).ids
            ids.append(plain)
            ids_special.append(None if special == prefix + plain + suffix else special)
            text_skip = tok.decode(special, skip_special_tokens=True)
            text = tok.decode(special, skip_special_tokens=False)
            decoded_skip.append(None if text_skip == case else text_skip)
            decoded.append(None if text == text_skip else text)
        results[name] = {
            "base": variant["base"], "patch": variant["patch"],
            "model_patch": variant["model_patch"], "special_prefix": prefix,
            "special_suffix": suffix, "ids": ids, "ids_special": ids_special,
            "decoded": decoded, "decoded_skip": decoded_skip,
            "random_decode": random_sequences(tok, data, 1000 + index)}
        log("variant %-32s %6d ids" % (name, sum(len(x) for x in ids)))

    pretokenize = {}
    for name, pattern in (("gpt2", GPT2_PATTERN), ("llama3", LLAMA3_PATTERN),
                          ("qwen2", QWEN2_PATTERN)):
        split = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
        pretokenize[name] = {"pattern": pattern,
                             "pieces": [[p for p, _ in split.pre_tokenize_str(c)] for c in cases]}
    expected = {"tokenizers_version": tokenizers.__version__,
                "python_version": sys.version.split()[0], "cases": cases,
                "variants": results, "pretokenize": pretokenize}
    write_json(os.path.join(out_dir, "expected.json"), expected)
    total = 0
    for root, _, files in os.walk(out_dir):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    log("done: %d bytes in %s" % (total, out_dir))


if __name__ == "__main__":
    main()
