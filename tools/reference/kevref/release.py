"""The synthetic Kev release in the real Hub file formats (release-pins.md), seeded.

`base/` mirrors `Qwen/Qwen3.5-4B-Base`: composite `qwen3_5` config.json, two safetensors shards with the published
`model.language_model.*` names (BF16, except `linear_attn.A_log` and `linear_attn.norm.weight` in F32), a few `mtp.*`
and `model.visual.*` tensors that loaders must skip, tokenizer files. `kev/` mirrors `jaredpalmer/kev-4b`: the PEFT
adapter as PEFT writes it around `AutoModelForCausalLM(...).model`, `head.pt` via `torch.save`, tokenizer files.

Widths are tiny; the vocabulary (248,320 embedding rows) and the layer pattern (3 Gated DeltaNet : 1 attention) are
real. Every parameter is random, norms included, so (1+w)-vs-w, A_log/dt_bias and similar mistakes show.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import struct
import zipfile
import zlib
from collections import OrderedDict
from pathlib import Path

import torch

BASE_REPO = "Qwen/Qwen3.5-4B-Base"
BASE_REVISION = "1001bb4d826a52d1f399e183466143f4da7b741b"
LORA_R = 16
LORA_ALPHA = 32
TARGET_MODULES = [
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    "in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b", "out_proj",
]
HEAD_DIM = 32
VOCAB = 248320
PREFIX = "model.language_model."
F32_SUFFIXES = ("linear_attn.A_log", "linear_attn.norm.weight")

TEXT_CONFIG = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_output_gate": True,
    "bos_token_id": None,
    "dtype": "bfloat16",
    "eos_token_id": 248044,
    "full_attention_interval": 4,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 16,
    "initializer_range": 0.02,
    "intermediate_size": 64,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_value_head_dim": 24,
    "mamba_ssm_dtype": "float32",
    "max_position_embeddings": 262144,
    "model_type": "qwen3_5_text",
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False,
    "num_attention_heads": 4,
    "num_hidden_layers": 8,
    "num_key_value_heads": 2,
    "pad_token_id": None,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {
        "mrope_interleaved": True,
        "mrope_section": [2, 1, 1],
        "partial_rotary_factor": 0.25,
        "rope_theta": 10000000,
        "rope_type": "default",
    },
    "tie_word_embeddings": True,
    "use_cache": True,
    "vocab_size": VOCAB,
}

VISION_CONFIG = {
    "deepstack_visual_indexes": [],
    "depth": 1,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 16,
    "in_channels": 3,
    "initializer_range": 0.02,
    "intermediate_size": 32,
    "model_type": "qwen3_5",
    "num_heads": 2,
    "num_position_embeddings": 16,
    "out_hidden_size": 16,
    "patch_size": 2,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}


def config_json() -> dict:
    """The composite `config.json` (decoder fields under `text_config`)."""
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "image_token_id": 248056,
        "model_type": "qwen3_5",
        "text_config": TEXT_CONFIG,
        "tie_word_embeddings": True,
        "transformers_version": "4.57.0.dev0",
        "video_token_id": 248057,
        "vision_config": VISION_CONFIG,
        "vision_end_token_id": 248054,
        "vision_start_token_id": 248053,
    }


def _gen(seed: int, name: str) -> torch.Generator:
    # One generator per tensor, keyed by name: values do not depend on the order tensors are visited in.
    g = torch.Generator()
    g.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return g


def _randn(seed: int, name: str, shape, std: float, mean: float = 0.0) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed, name), dtype=torch.float32) * std + mean


def _uniform(seed: int, name: str, shape, lo: float, hi: float) -> torch.Tensor:
    return torch.rand(*shape, generator=_gen(seed, name), dtype=torch.float32) * (hi - lo) + lo


def text_tensor_shapes() -> "OrderedDict[str, tuple[int, ...]]":
    """Names (without prefix) and shapes of the text backbone, from transformers' own module tree."""
    from transformers import Qwen3_5TextConfig, Qwen3_5TextModel

    cfg = Qwen3_5TextConfig(**{k: v for k, v in TEXT_CONFIG.items() if k not in ("model_type", "dtype")})
    with torch.device("meta"):
        m = Qwen3_5TextModel(cfg)
    return OrderedDict((n, tuple(p.shape)) for n, p in m.state_dict().items())


def text_tensor_values(seed: int) -> "OrderedDict[str, torch.Tensor]":
    """fp32 values of every backbone tensor (before the storage cast)."""
    out: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    for name, shape in text_tensor_shapes().items():
        leaf = name.rsplit(".", 1)[0].rsplit(".", 1)[-1] if name.endswith(".weight") else name.rsplit(".", 1)[-1]
        if name == "embed_tokens.weight":
            t = _randn(seed, name, shape, 1.0)
        elif name.endswith("linear_attn.A_log"):
            t = torch.log(_uniform(seed, name, shape, 0.3, 3.0))
        elif name.endswith("linear_attn.dt_bias"):
            t = _randn(seed, name, shape, 0.6, -0.5)
        elif name.endswith("linear_attn.norm.weight"):
            t = _randn(seed, name, shape, 0.3, 1.0)  # gated norm: x·w
        elif name.endswith("conv1d.weight"):
            t = _randn(seed, name, shape, 0.6)
        elif leaf in ("input_layernorm", "post_attention_layernorm", "q_norm", "k_norm", "norm"):
            t = _uniform(seed, name, shape, -0.6, 0.6)  # (1+w) norms; HF initialises these to 0
        elif len(shape) == 2:
            t = _randn(seed, name, shape, 1.0 / math.sqrt(shape[1]))
        else:
            raise AssertionError(f"unhandled tensor {name} {shape}")
        out[name] = t
    return out


def storage_dtype(name: str) -> torch.dtype:
    """Published storage dtype of a base tensor (full name)."""
    return torch.float32 if name.endswith(F32_SUFFIXES) else torch.bfloat16


def extra_tensors(seed: int) -> "OrderedDict[str, torch.Tensor]":
    """A tiny vision tower (real module names) and the 15 MTP tensors; loaders of the text backbone skip both."""
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    vc = Qwen3_5VisionConfig(**{k: v for k, v in VISION_CONFIG.items() if k != "model_type"})
    with torch.device("meta"):
        vm = Qwen3_5VisionModel(vc)
    out: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    for n, p in vm.state_dict().items():
        name = "model.visual." + n
        out[name] = _randn(seed, name, tuple(p.shape), 0.1)
    h, i, hd = TEXT_CONFIG["hidden_size"], TEXT_CONFIG["intermediate_size"], TEXT_CONFIG["head_dim"]
    nh, nkv = TEXT_CONFIG["num_attention_heads"], TEXT_CONFIG["num_key_value_heads"]
    mtp = {
        "mtp.fc.weight": (h, 2 * h),
        "mtp.layers.0.input_layernorm.weight": (h,),
        "mtp.layers.0.mlp.down_proj.weight": (h, i),
        "mtp.layers.0.mlp.gate_proj.weight": (i, h),
        "mtp.layers.0.mlp.up_proj.weight": (i, h),
        "mtp.layers.0.post_attention_layernorm.weight": (h,),
        "mtp.layers.0.self_attn.k_norm.weight": (hd,),
        "mtp.layers.0.self_attn.k_proj.weight": (nkv * hd, h),
        "mtp.layers.0.self_attn.o_proj.weight": (h, nh * hd),
        "mtp.layers.0.self_attn.q_norm.weight": (hd,),
        "mtp.layers.0.self_attn.q_proj.weight": (2 * nh * hd, h),
        "mtp.layers.0.self_attn.v_proj.weight": (nkv * hd, h),
        "mtp.norm.weight": (h,),
        "mtp.pre_fc_norm_embedding.weight": (h,),
        "mtp.pre_fc_norm_hidden.weight": (h,),
    }
    for name, shape in mtp.items():
        out[name] = _randn(seed, name, shape, 0.1)
    return out


def base_state(seed: int) -> "OrderedDict[str, torch.Tensor]":
    """Every base tensor under its published name, in its storage dtype."""
    out: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    for n, t in text_tensor_values(seed).items():
        name = PREFIX + n
        out[name] = t.to(storage_dtype(name)).contiguous()
    for n, t in extra_tensors(seed).items():
        out[n] = t.to(torch.bfloat16).contiguous()
    return out


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def write_base(out: Path, seed: int) -> None:
    """config.json, two shards and the index; tokenizer files are written by the caller."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = base_state(seed)
    names = sorted(state)
    # Shard 1: the embedding and the first half of the layers (the Hub's split is by size; so is this, roughly).
    first = [n for n in names if n == PREFIX + "embed_tokens.weight" or any(
        n.startswith(f"{PREFIX}layers.{i}.") for i in range(4))]
    second = [n for n in names if n not in set(first)]
    shards = [first, second]
    weight_map = {}
    total = 0
    for k, group in enumerate(shards, start=1):
        fname = f"model.safetensors-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: state[n] for n in group}, str(out / fname), metadata={"format": "pt"})
        for n in group:
            weight_map[n] = fname
            total += _nbytes(state[n])
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    (out / "config.json").write_text(json.dumps(config_json(), indent=2, sort_keys=True) + "\n")


def load_text_model(base_dir: Path, dtype: torch.dtype = torch.float32):
    """transformers' `AutoModelForCausalLM.from_pretrained(base_dir).model` (the text backbone), eval mode."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    m = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=dtype)
    return m.model.eval()


def write_adapter(base_dir: Path, out: Path, seed: int) -> None:
    """adapter_config.json + adapter_model.safetensors, written by PEFT itself around the loaded text backbone."""
    from peft import LoraConfig, get_peft_model

    out.mkdir(parents=True, exist_ok=True)
    text = load_text_model(base_dir)
    cfg = LoraConfig(
        r=LORA_R,
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        bias="none",
        target_modules=TARGET_MODULES,
        base_model_name_or_path=BASE_REPO,
        revision=BASE_REVISION,
        init_lora_weights=True,
    )
    pm = get_peft_model(text, cfg)
    # A on a 2^-6 grid (|a| < 2) and B on a 2^-12 grid (|b| < 0.5): every product is a multiple of 2^-18 below 1,
    # so B@A over r = 16 terms is exact in fp32 whatever the summation order (22 significant bits at most).
    # The merged bf16 bits (expected/merge.json) then do not depend on the GEMM kernel that computes B@A.
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_A" in name:
                v = _randn(seed, name, tuple(p.shape), 1.0 / math.sqrt(p.shape[1]))
                p.copy_(torch.clamp(torch.round(v * 64) / 64, -127 / 64, 127 / 64))
            elif "lora_B" in name:
                # |B@A|·2 ≈ 0.35·|W|: large enough that a missing or misplaced LoRA is obvious downstream.
                v = _randn(seed, name, tuple(p.shape), 0.35 / math.sqrt(2.0 * LORA_R))
                p.copy_(torch.clamp(torch.round(v * 4096) / 4096, -2047 / 4096, 2047 / 4096))
    pm.save_pretrained(str(out))
    readme = out / "README.md"
    if readme.exists():
        readme.unlink()  # PEFT's generated model card: not part of the mirrored layout
    # PEFT records the local path it was given; the Hub file names the base repo. PEFT keeps target_modules as a
    # set, so its saved order follows string hashing; sorted, the file is reproducible.
    cfg_path = out / "adapter_config.json"
    ac = json.loads(cfg_path.read_text())
    ac["base_model_name_or_path"] = BASE_REPO
    ac["target_modules"] = sorted(ac["target_modules"])
    cfg_path.write_text(json.dumps(ac, indent=2, sort_keys=True))


class PointerHead(torch.nn.Module):
    """The author's head module shape (kev-contract §6): `q`, `k` = Linear(d, head_dim) with bias."""

    def __init__(self, d: int, head_dim: int):
        super().__init__()
        self.q = torch.nn.Linear(d, head_dim)
        self.k = torch.nn.Linear(d, head_dim)


def head_payload(seed: int) -> dict:
    """The `head.pt` dictionary (kev-contract §1 key set, real key order); `head` is a module `state_dict()`
    (an OrderedDict carrying `_metadata`, as the author's `torch.save` of `head.state_dict()` would)."""
    d = TEXT_CONFIG["hidden_size"]
    g = _gen(seed, "head.temperature")
    temperature = float(1.8 + torch.rand((), generator=g, dtype=torch.float64).item())
    module = PointerHead(d, HEAD_DIM)
    with torch.no_grad():
        module.q.weight.copy_(_randn(seed, "head.q.weight", (HEAD_DIM, d), 2.2 / math.sqrt(d)))
        module.q.bias.copy_(_randn(seed, "head.q.bias", (HEAD_DIM,), 0.3))
        module.k.weight.copy_(_randn(seed, "head.k.weight", (HEAD_DIM, d), 2.2 / math.sqrt(d)))
        module.k.bias.copy_(_randn(seed, "head.k.bias", (HEAD_DIM,), 0.3))
    head = module.state_dict()
    if list(head) != ["q.weight", "q.bias", "k.weight", "k.bias"]:
        raise AssertionError(f"unexpected head keys {list(head)}")
    return {
        "base": BASE_REPO,
        "base_revision": BASE_REVISION,
        "lora": LORA_R,
        "head_dim": HEAD_DIM,
        "option_isolation": False,
        "special_embeddings": False,
        "weights_dtype": "bfloat16",
        "temperature": temperature,
        "lora_placement": "all",
        "head": head,
    }


def deterministic_torch_save(obj, path: Path) -> None:
    """`torch.save`, then replace the random `.data/serialization_id` record by a digest of the other records.

    torch's zip writer already uses fixed timestamps and no compression; the serialization id is the only varying
    byte range. It is rewritten in place (same length, CRC-32 fixed in the local and central headers).
    """
    torch.save(obj, str(path))
    raw = bytearray(path.read_bytes())
    zf = zipfile.ZipFile(io.BytesIO(bytes(raw)))
    infos = zf.infolist()
    sid = [i for i in infos if i.filename.endswith("/.data/serialization_id")]
    if len(sid) != 1 or sid[0].compress_type != zipfile.ZIP_STORED:
        raise AssertionError("unexpected torch.save layout")
    info = sid[0]
    h = hashlib.sha256()
    for i in infos:
        if i is not info:
            h.update(i.filename.encode())
            h.update(zf.read(i.filename))
    new = str(int.from_bytes(h.digest(), "big") % 10**info.file_size).zfill(info.file_size).encode()
    crc = zlib.crc32(new) & 0xFFFFFFFF
    off = info.header_offset
    if raw[off : off + 4] != b"PK\x03\x04":
        raise AssertionError("bad local header")
    name_len, extra_len = struct.unpack_from("<HH", raw, off + 26)
    data_off = off + 30 + name_len + extra_len
    raw[data_off : data_off + info.file_size] = new
    struct.pack_into("<I", raw, off + 14, crc)
    # central directory entry for the same file
    pos = raw.find(b"PK\x01\x02")
    fixed = False
    while pos >= 0:
        n_len, e_len, c_len = struct.unpack_from("<HHH", raw, pos + 28)
        fname = bytes(raw[pos + 46 : pos + 46 + n_len]).decode()
        (local_off,) = struct.unpack_from("<I", raw, pos + 42)
        if fname == info.filename and local_off in (off, 0xFFFFFFFF):
            struct.pack_into("<I", raw, pos + 16, crc)
            fixed = True
            break
        pos = raw.find(b"PK\x01\x02", pos + 46 + n_len + e_len + c_len)
    if not fixed:
        raise AssertionError("central directory entry not found")
    path.write_bytes(bytes(raw))
    # the result must still load and carry the same payload
    torch.load(str(path), weights_only=True)


def write_head(out: Path, seed: int) -> dict:
    """head.pt; returns the payload."""
    out.mkdir(parents=True, exist_ok=True)
    payload = head_payload(seed)
    deterministic_torch_save(payload, out / "head.pt")
    return payload


def link_or_write(path: Path, text: str, link_target: Path | None) -> None:
    """Write a tokenizer file, or make it a relative symlink to `link_target`."""
    if path.is_symlink() or path.exists():
        path.unlink()
    if link_target is None:
        path.write_text(text, encoding="utf-8")
    else:
        os.symlink(os.path.relpath(link_target, path.parent), path)
