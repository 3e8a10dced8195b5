#!/usr/bin/env python3
"""scripts/make_spm_tokenizer_golden.py — SentencePiece-style tokenizer.json files (BPE with byte
fallback and "▁" for spaces, as Gemma, Llama 2 and Mistral ship them) and the ids Hugging Face's
`tokenizers` library gives for a set of texts, stored in tests/golden/tokenizers/ for
tests/tokenizer_spm_json_test.cpp.

The tokenizers are made here, not downloaded: a small SentencePiece BPE model is trained on this
repository's docs (with byte fallback and two user-defined turn markers), then converted to
tokenizer.json by transformers' own converters (GemmaConverter; LlamaConverter legacy and not),
which are what produced the Hub's files. Needs a venv with transformers, tokenizers,
sentencepiece and protobuf:
    .venv/bin/python scripts/make_spm_tokenizer_golden.py
"""
import glob, json, os, random, tempfile

import sentencepiece as spm
from tokenizers import Tokenizer
from transformers.convert_slow_tokenizer import GemmaConverter, LlamaConverter
from transformers.tokenization_utils_base import generate_merges

ROOT = os.path.join(os.path.dirname(__file__), "..")
OUT = os.path.join(ROOT, "tests", "golden", "tokenizers")

TEXTS = [
    "Hello world",
    " Hello world",
    "Hello  world,   three   spaces",
    "  leading and trailing  ",
    "tabs\tand\nnewlines\n\nblank line",
    "café naïve Zürich",
    "東京 and привет and γειά",
    "emoji 🙂 and a rare one 🦜 and ✓",
    "digits 1234567890 and 3.14159",
    "<start_of_turn>user\nWhat is the KV cache?<end_of_turn>\n<start_of_turn>model\n",
    "text right before<end_of_turn>and after",
    "the paged KV cache and the op registry",
    "x",
    " ",
    "",
    "▁already has the marker",
    "mixed\u00a0nbsp and \u200bzero width",
    "quantized matmul kernels with VNNI and AVX2 tiles",
]


def train(prefix, gemma):
    corpus = os.path.join(os.path.dirname(prefix), "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        for p in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]:
            f.write(open(p, encoding="utf-8").read())
        rnd = random.Random(1)
        words = ["café", "naïve", "Zürich", "東京", "привет", "γειά", "🙂", "  indented", "tabs\there", "a  b   c"]
        for _ in range(2000):
            f.write(" ".join(rnd.choice(words) for _ in range(8)) + "\n")
    # Gemma's model has no dummy prefix (its converter adds none either).
    ids = dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
               add_dummy_prefix=False) if gemma \
        else dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    spm.SentencePieceTrainer.train(input=corpus, model_prefix=prefix, vocab_size=2000, model_type="bpe", byte_fallback=True,
                                   character_coverage=0.9995, split_digits=True, allow_whitespace_only_pieces=True,
                                   remove_extra_whitespaces=False, normalization_rule_name="identity",
                                   user_defined_symbols=["<start_of_turn>", "<end_of_turn>"], num_threads=1,
                                   minloglevel=2, **ids)
    return prefix + ".model"


class Extractor:
    """The vocabulary and the merges ranked by piece score, as transformers' SentencePiece
    extractors compute them (generate_merges); its own extractor classes do not run standalone in
    the transformers release this was made with."""

    def __init__(self, model_file):
        self.sp = spm.SentencePieceProcessor(model_file=model_file)

    def extract(self, vocab_scores=None):
        vocab = {self.sp.id_to_piece(i): i for i in range(self.sp.get_piece_size())}
        return vocab, generate_merges(vocab, vocab_scores)


GemmaConverter.SpmExtractor = Extractor
LlamaConverter.SpmExtractor = Extractor


class Original:  # what the converters read from a slow tokenizer
    def __init__(self, model_file, gemma, legacy):
        self.vocab_file = model_file
        self.legacy = legacy
        self.add_prefix_space = True
        self.pad_token, self.eos_token, self.bos_token = ("<pad>", "<eos>", "<bos>") if gemma else (None, "</s>", "<s>")
        self.sp = spm.SentencePieceProcessor(model_file=model_file)

    def convert_ids_to_tokens(self, i):
        return self.sp.id_to_piece(i)


def main():
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, gemma, legacy in [("spm_gemma", True, True), ("spm_llama_legacy", False, True), ("spm_llama", False, False)]:
            model = train(os.path.join(tmp, name), gemma)
            conv = (GemmaConverter if gemma else LlamaConverter)(Original(model, gemma, legacy))
            tok = conv.converted()
            d = os.path.join(OUT, name)
            os.makedirs(d, exist_ok=True)
            tok.save(os.path.join(d, "tokenizer.json"))
            tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
            sp = spm.SentencePieceProcessor(model_file=model)
            cases = []
            same = 0
            for t in TEXTS:
                ids = tok.encode(t, add_special_tokens=False).ids
                same += ids == sp.encode(t)
                cases.append({"text": t, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
            with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:  # one case per line
                f.write('{"tokenizer": "%s", "cases": [\n' % name)
                f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
                f.write("\n]}\n")
            print(f"{name}: {len(cases)} texts; sentencepiece itself agrees on {same}")


if __name__ == "__main__":
    main()
