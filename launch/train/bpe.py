"""Byte-level BPE (GPT-2 style): training, encoding, decoding, and tokenizer.json I/O.

Encoding follows what Hugging Face `tokenizers` does for the tokenizer.json written here:
  1. added (special) tokens are cut out of the text first and map straight to their ids;
  2. each remaining piece is split with the GPT-2 regex (ByteLevel pre-tokenizer, use_regex,
     no prefix space), and each pre-token's UTF-8 bytes are mapped to printable characters
     with the GPT-2 byte->unicode table;
  3. within each pre-token, the adjacent pair with the lowest merge rank is merged (every
     non-overlapping occurrence, left to right) until no pair has a rank.
Decoding maps the characters back to bytes and decodes UTF-8 (invalid bytes -> U+FFFD).
"""
import heapq
import json
from collections import Counter, defaultdict

import regex

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_SPLIT = regex.compile(GPT2_PATTERN)


def byte_to_unicode():
    """The GPT-2 table: printable Latin-1 bytes map to themselves, the other 68 bytes to
    U+0100.. in byte order, so every byte has a visible, non-space character."""
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


B2U = byte_to_unicode()
U2B = {c: b for b, c in B2U.items()}


def pre_tokenize(text):
    """Text without special tokens -> list of byte-level pre-token strings."""
    return ["".join(B2U[b] for b in piece.encode("utf-8")) for piece in _SPLIT.findall(text)]


def merge_pair(symbols, a, b):
    """Replaces every non-overlapping (a, b) in symbols, scanning left to right."""
    out, i, n = [], 0, len(symbols)
    while i < n:
        if i + 1 < n and symbols[i] == a and symbols[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def train_bpe(texts, vocab_size, specials):
    """texts: iterable of strings (no special tokens inside). Returns (vocab, merges).

    vocab: token -> id with the specials first, then the 256 byte characters in byte order,
    then one token per merge in the order learned. Merges are picked by pair frequency over
    the pre-token counts; ties go to the lexicographically smallest pair. Pair counts are
    updated incrementally, only for the words that contain the merged pair.
    """
    counts = Counter()
    for t in texts:
        counts.update(pre_tokenize(t))
    words = [list(w) for w in counts]
    freq = [counts[w] for w in counts]

    pair_count = defaultdict(int)
    where = defaultdict(set)  # pair -> indices of words containing it
    for wi, sym in enumerate(words):
        for p in zip(sym, sym[1:]):
            pair_count[p] += freq[wi]
            where[p].add(wi)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)

    vocab = {}
    for s in specials:
        vocab[s] = len(vocab)
    for b in range(256):
        vocab[B2U[b]] = len(vocab)
    merges = []
    while len(vocab) < vocab_size and heap:
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc or negc == 0:
            continue  # stale heap entry
        a, b = pair
        merges.append(pair)
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
        touched = set()
        for wi in list(where[pair]):
            old = words[wi]
            new = merge_pair(old, a, b)
            f = freq[wi]
            for p in zip(old, old[1:]):
                pair_count[p] -= f
                touched.add(p)
            for p in zip(old, old[1:]):
                where[p].discard(wi)
            for p in zip(new, new[1:]):
                pair_count[p] += f
                where[p].add(wi)
                touched.add(p)
            words[wi] = new
        for p in touched:
            c = pair_count[p]
            if c > 0:
                heapq.heappush(heap, (-c, p))
            else:
                pair_count.pop(p, None)
                where.pop(p, None)
    return vocab, merges


class Tokenizer:
    def __init__(self, vocab, merges, specials):
        self.vocab = vocab
        self.id_to_token = {i: t for t, i in vocab.items()}
        self.rank = {tuple(m): r for r, m in enumerate(merges)}
        self.merges = [tuple(m) for m in merges]
        self.specials = list(specials)
        self.special_ids = {s: vocab[s] for s in specials}
        alt = "|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True))
        self._special_split = regex.compile(f"({alt})") if specials else None
        self._cache = {}

    # ------------------------------------------------------------------ encode
    def _bpe(self, word):
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        sym = list(word)
        while len(sym) > 1:
            best, best_rank = None, None
            for p in zip(sym, sym[1:]):
                r = self.rank.get(p)
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = p, r
            if best is None:
                break
            sym = merge_pair(sym, *best)
        ids = [self.vocab[s] for s in sym]
        self._cache[word] = ids
        return ids

    def encode(self, text, allow_special=True):
        ids = []
        pieces = self._special_split.split(text) if (allow_special and self._special_split) else [text]
        for piece in pieces:
            if piece in self.special_ids:
                ids.append(self.special_ids[piece])
            elif piece:
                for w in pre_tokenize(piece):
                    ids.extend(self._bpe(w))
        return ids

    # ------------------------------------------------------------------ decode
    def decode(self, ids, skip_special=False):
        out, buf = [], bytearray()
        for i in ids:
            tok = self.id_to_token[int(i)]
            if tok in self.special_ids:
                out.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
                if not skip_special:
                    out.append(tok)
            else:
                buf.extend(U2B[c] for c in tok)
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    # ------------------------------------------------------------------ files
    def tokenizer_json(self):
        byte_level = lambda prefix, trim: {"type": "ByteLevel", "add_prefix_space": prefix,
                                           "trim_offsets": trim, "use_regex": True}
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [
                {"id": self.vocab[s], "content": s, "single_word": False, "lstrip": False,
                 "rstrip": False, "normalized": False, "special": True}
                for s in self.specials
            ],
            "normalizer": None,
            "pre_tokenizer": byte_level(False, True),
            "post_processor": byte_level(True, False),
            "decoder": byte_level(True, True),
            "model": {
                "type": "BPE",
                "dropout": None,
                "unk_token": None,
                "continuing_subword_prefix": None,
                "end_of_word_suffix": None,
                "fuse_unk": False,
                "byte_fallback": False,
                "ignore_merges": False,
                "vocab": dict(sorted(self.vocab.items(), key=lambda kv: kv[1])),
                "merges": [f"{a} {b}" for a, b in self.merges],
            },
        }

    def save(self, path):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.tokenizer_json(), f, ensure_ascii=False, indent=2)
            f.write("\n")

    @classmethod
    def load(cls, path):
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        m = j["model"]
        merges = [tuple(x.split(" ")) if isinstance(x, str) else tuple(x) for x in m["merges"]]
        specials = [t["content"] for t in j["added_tokens"]]
        vocab = dict(m["vocab"])
        for t in j["added_tokens"]:
            vocab[t["content"]] = t["id"]
        return cls(vocab, merges, specials)
