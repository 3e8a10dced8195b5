#!/usr/bin/env python3
# fuzz/make_seeds.py — writes the small hand-built seed inputs of fuzz/corpus/ (GGUF with every metadata
# and tensor type and tiny tokenizers, safetensors, llama2.c legacy and v1 headers, tokenizer.json).
# The synth-made GGUF seed comes from `fastpath synth` (see fuzz/README.md). Run from the repo root.
import json, os, struct

OUT = "fuzz/corpus"

def put(target, name, data):
    os.makedirs(f"{OUT}/{target}", exist_ok=True)
    with open(f"{OUT}/{target}/{name}", "wb") as f:
        f.write(data)

# ---- GGUF
def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}

def val(t, v):
    if t == STR:
        return s(v)
    if t == ARR:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        return out + b"".join(val(et, i) for i in items)
    return struct.pack(SCALAR[t], v)

def gguf(kvs, tensors, align=32):
    """kvs: [(key, type, value)], tensors: [(name, ne, ggml_type, bytes)]"""
    head = struct.pack("<IIQQ", 0x46554747, 3, len(tensors), len(kvs))
    for k, t, v in kvs:
        head += s(k) + struct.pack("<I", t) + val(t, v)
    off, data = 0, b""
    for name, ne, gt, raw in tensors:
        head += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<q", d) for d in ne)
        head += struct.pack("<IQ", gt, off)
        data += raw + b"\0" * (-len(raw) % align)
        off = len(data)
    head += b"\0" * (-len(head) % align)
    return head + data

def blocks(n, size, seed):
    return bytes((seed * 131 + i * 7) % 251 for i in range(n * size))

types = [  # (ggml type, elements per block, bytes per block)
    (0, 1, 4), (1, 1, 2), (30, 1, 2), (8, 32, 34), (2, 32, 18), (12, 256, 144), (14, 256, 210),
    (24, 1, 1), (25, 1, 2), (26, 1, 4), (27, 1, 8), (28, 1, 8)]
tensors = []
for i, (gt, be, bb) in enumerate(types):
    ne0 = be * (2 if be > 1 else 8)
    tensors.append((f"t{gt}", [ne0, 2], gt, blocks(2 * ne0 // be, bb, i)))
kvs = [("general.architecture", STR, "llama"), ("general.alignment", U32, 64), ("u8", U8, 7), ("i8", I8, -7),
       ("u16", U16, 700), ("i16", I16, -700), ("i32", I32, -70000), ("u64", U64, 1 << 40), ("i64", I64, -(1 << 40)),
       ("f32", F32, 1.5), ("f64", F64, -2.25), ("bool", BOOL, True), ("arr.f32", ARR, (F32, [1.0, 2.0])),
       ("arr.str", ARR, (STR, ["a", "bc"])), ("arr.nested", ARR, (ARR, [(I32, [1, 2]), (BOOL, [True])]))]
put("fuzz_gguf", "all_types.gguf.seed", gguf(kvs, tensors, align=64))

# byte-level BPE ("gpt2") vocabulary: the 256 byte characters of GPT-2, a few merges, specials.
def gpt2_bytes():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]
byte_chars = gpt2_bytes()
merges = ["Ġ t", "h e", "Ġt he", "l l", "ll o", "Ġ w", "o r", "Ġw or", "Ġwor ld", "H e", "He llo"]
bpe_tokens = byte_chars + [m.replace(" ", "") for m in merges] + ["<|endoftext|>", "<|im_start|>"]
bpe_types = [1] * (len(bpe_tokens) - 2) + [3, 3]
put("fuzz_gguf", "tok_gpt2.gguf.seed", gguf([
    ("general.architecture", STR, "llama"), ("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.pre", STR, "qwen2"),
    ("tokenizer.ggml.tokens", ARR, (STR, bpe_tokens)), ("tokenizer.ggml.token_type", ARR, (I32, bpe_types)),
    ("tokenizer.ggml.merges", ARR, (STR, merges)), ("tokenizer.ggml.bos_token_id", U32, len(bpe_tokens) - 2),
    ("tokenizer.ggml.eos_token_id", U32, len(bpe_tokens) - 2)], []))
# SentencePiece ("llama") vocabulary with byte fallback.
spm = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "▁t", "he", "▁the", "l", "o", "▁w", "or", "ld", "H", "e"]
spm_types = [2, 3, 3] + [6] * 256 + [1] * 11
spm_scores = [0.0] * 259 + [-float(i) for i in range(11)]
put("fuzz_gguf", "tok_llama.gguf.seed", gguf([
    ("general.architecture", STR, "llama"), ("tokenizer.ggml.model", STR, "llama"),
    ("tokenizer.ggml.tokens", ARR, (STR, spm)), ("tokenizer.ggml.scores", ARR, (F32, spm_scores)),
    ("tokenizer.ggml.token_type", ARR, (I32, spm_types)), ("tokenizer.ggml.bos_token_id", U32, 1),
    ("tokenizer.ggml.eos_token_id", U32, 2), ("tokenizer.ggml.unknown_token_id", U32, 0)], []))

# ---- safetensors
def safetensors(entries, metadata=None):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-(len(h) + 8) % 8)
    return struct.pack("<Q", len(h)) + h + data
put("fuzz_safetensors", "small.safetensors.seed", safetensors([
    ("model.embed_tokens.weight", "F32", [4, 8], blocks(32, 4, 1)), ("a.f16", "F16", [3, 2], blocks(6, 2, 2)),
    ("a.bf16", "BF16", [2, 2, 2], blocks(8, 2, 3)), ("a.fp8", "F8_E4M3", [16], blocks(16, 1, 4)),
    ("a.i64", "I64", [2], blocks(2, 8, 5)), ("a.empty", "F32", [0, 4], b""), ("a.scalar", "F64", [], blocks(1, 8, 6))],
    {"format": "pt"}))

# ---- llama2.c: legacy header (negative vocab = untied) and version 1 ("ak42")
def llama2c_legacy(dim, hid, layers, heads, kv, vocab, seq, shared):
    hs = dim // heads
    n = vocab * dim + layers * (dim + 2 * dim * dim + 2 * (kv * hs) * dim + dim + 3 * hid * dim) + dim + seq * hs
    if not shared:
        n += vocab * dim
    return struct.pack("<7i", dim, hid, layers, heads, kv, vocab if shared else -vocab, seq) + blocks(n, 4, 9)[: n * 4]
def llama2c_v1(dim, hid, layers, heads, kv, vocab, seq, shared):
    hs = dim // heads
    n = layers * 2 * dim + dim + vocab * dim + layers * (2 * dim * dim + 2 * kv * hs * dim + 3 * hid * dim)
    if not shared:
        n += vocab * dim
    h = struct.pack("<I8iB", 0x616B3432, 1, dim, hid, layers, heads, kv, vocab, seq, 1 if shared else 0)
    return h + b"\0" * (256 - len(h)) + blocks(n, 4, 11)[: n * 4]
put("fuzz_llama2c", "legacy_shared.bin", llama2c_legacy(8, 16, 1, 2, 1, 8, 4, True))
put("fuzz_llama2c", "legacy_untied.bin", llama2c_legacy(4, 8, 2, 2, 2, 4, 2, False))
put("fuzz_llama2c", "v1_shared.bin", llama2c_v1(8, 16, 1, 2, 2, 4, 4, True))

# ---- tokenizer.json: a minimal byte-level BPE
vocab = {c: i for i, c in enumerate(byte_chars)}
for m in merges:
    vocab.setdefault(m.replace(" ", ""), len(vocab))
tok = {
    "version": "1.0",
    "added_tokens": [{"id": len(vocab), "content": "<|endoftext|>", "special": True},
                     {"id": len(vocab) + 1, "content": "<|im_start|>", "special": True}],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                                               {"Sequence": {"id": "A", "type_id": 0}}]},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "ignore_merges": False, "vocab": vocab, "merges": merges},
}
put("fuzz_tokenizer_json", "bpe_small.json", json.dumps(tok, ensure_ascii=False).encode())
tok2 = {"model": {"type": "BPE", "vocab": {c: i for i, c in enumerate(byte_chars[:64] + ["Ġ", "Ġt"])}, "merges": [["Ġ", "t"]]},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True}, "decoder": {"type": "ByteLevel"}}
put("fuzz_tokenizer_json", "bpe_pairs.json", json.dumps(tok2, ensure_ascii=False).encode())
