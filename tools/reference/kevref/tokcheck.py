"""Cross-check a built `tokenizer.json` against tiktoken-style encoding over the same ranks.

The shipped files use `ignore_merges: false`, what transformers' `Qwen2Tokenizer`/`Qwen3_5Tokenizer` build (their
`BPE(...)` never sets it), so Kev's pipeline did not look whole pre-tokenized pieces up in the vocabulary first, while
tiktoken does. The two therefore differ exactly on pieces equal to one of the ~232 tokens that byte-pair merging
cannot reach (e.g. "加拿大"). The check runs in two modes:

* strict: the same file with `ignore_merges: true` must give tiktoken's ids everywhere (proves the merges);
* shipped: tiktoken's ids with every unreachable token expanded to its BPE parts must give the file's ids.
"""

from __future__ import annotations

import json
import random
import sys
import unicodedata
from pathlib import Path

from . import tokenizer_build as tb


def corpus(seed: int = 0, max_files_bytes: int = 3_000_000) -> list[str]:
    """A large varied text: source/docs from the Python install, vocab-token soups in every script, Unicode sweeps."""
    rng = random.Random(seed)
    docs: list[str] = []
    # 1. real-world text: source files and docs of the installed packages (English, code, some non-ASCII)
    site = Path(json.__file__).resolve().parent.parent
    files = sorted(p for p in site.rglob("*") if p.suffix in {".py", ".md", ".txt", ".rst", ".json"} and p.is_file())
    rng.shuffle(files)
    total = 0
    for p in files:
        try:
            t = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(t) > 200_000:
            continue
        docs.append(t)
        total += len(t)
        if total > max_files_bytes:
            break
    # 2. soups of random vocabulary entries (all scripts, all merge paths), joined with and without spaces
    ranks = tb.load_ranks()
    inv = sorted(ranks, key=ranks.__getitem__)
    for _ in range(400):
        parts = [inv[rng.randrange(len(inv))] for _ in range(rng.randrange(20, 400))]
        sep = rng.choice([b"", b" ", b"\n", b""])
        docs.append(sep.join(parts).decode("utf-8", errors="ignore"))
    # 3. every vocabulary entry alone (valid UTF-8 ones)
    alone = []
    for tok in inv:
        try:
            alone.append(tok.decode("utf-8"))
        except UnicodeDecodeError:
            pass
    for i in range(0, len(alone), 2000):
        docs.append("\u0000".join(alone[i : i + 2000]))
    # 4. Unicode sweeps: letters + combining marks of many scripts, digits, punctuation, whitespace mixes
    blocks = [(0x0900, 0x097F), (0x0E00, 0x0E7F), (0x0600, 0x06FF), (0x0400, 0x04FF), (0x3040, 0x30FF),
              (0xAC00, 0xAD00), (0x4E00, 0x4F00), (0x0300, 0x036F), (0x1F300, 0x1F64F), (0x0980, 0x09FF),
              (0x0B80, 0x0BFF), (0x0590, 0x05FF), (0x10A0, 0x10FF), (0x0370, 0x03FF), (0x00A0, 0x024F)]
    chars = [chr(c) for a, b in blocks for c in range(a, b) if unicodedata.category(chr(c)) != "Cn"]
    ws = [" ", "  ", "\n", "\r\n", "\t", " \n ", "\u3000", "\u00a0"]
    for _ in range(300):
        out = []
        for _ in range(rng.randrange(50, 400)):
            r = rng.random()
            if r < 0.7:
                out.append(rng.choice(chars))
            elif r < 0.8:
                out.append(rng.choice(ws))
            elif r < 0.9:
                out.append(rng.choice("0123456789'sS'LL'd.,!?-_()[]{}<>|¦/\\\"#@$%^&*+=~`"))
            else:
                out.append(rng.choice(["<|fim_suffix|>", "<think>", "<¦box_end¦>", "'re", "'VE", "नमस्ते", "क्"]))
        docs.append("".join(out))
    return docs


def check(tokenizer_json: str, variant: str, docs: list[str]) -> dict:
    """Compare one built file with tiktoken on `docs`; raises AssertionError on any unexplained difference."""
    from tokenizers import Tokenizer

    shipped = Tokenizer.from_str(tokenizer_json)
    doc = json.loads(tokenizer_json)
    doc["model"]["ignore_merges"] = True
    strict = Tokenizer.from_str(json.dumps(doc))
    ranks = tb.load_ranks()
    unreachable: dict[int, list[int]] = {}
    for tok, rank in ranks.items():
        if len(tok) > 1:
            parts = tb._bpe_parts(ranks, tok, rank)
            if len(parts) != 2:
                unreachable[rank] = [ranks[p] for p in tb._bpe_parts(ranks, tok, 1 << 30)]
    tik = tb.tiktoken_encoder(variant)
    n_tokens = n_chars = n_expanded = 0
    for i, text in enumerate(docs):
        want = tik(text)
        got_strict = strict.encode(text, add_special_tokens=False).ids
        if got_strict != want:
            raise AssertionError(f"{variant}: doc {i} differs from tiktoken (strict mode): {text[:80]!r}")
        expanded: list[int] = []
        for t in want:
            if t in unreachable:
                n_expanded += 1
                expanded.extend(unreachable[t])
            else:
                expanded.append(t)
        got = shipped.encode(text, add_special_tokens=False).ids
        if got != expanded:
            raise AssertionError(f"{variant}: doc {i} differs from expanded tiktoken (shipped mode): {text[:80]!r}")
        n_tokens += len(want)
        n_chars += len(text)
    return {"docs": len(docs), "chars": n_chars, "tokens": n_tokens, "unreachable_tokens_seen": n_expanded,
            "unreachable_vocab": len(unreachable)}


if __name__ == "__main__":
    # python -m kevref.tokcheck fixtures/release  (checks base/ and kev/ tokenizer.json under it)
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[3] / "fixtures" / "release"
    d = corpus()
    for v in ("base", "kev"):
        print(v, check((root / v / "tokenizer.json").read_text(encoding="utf-8"), v, d))
