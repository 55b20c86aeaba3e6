"""The three arms that produce probabilities for a compiled request.

* `reference`  — the author's fp32 path: transformers `AutoModelForCausalLM.from_pretrained(base, float32).model`
  with the LoRA applied *unmerged* through PEFT (`PeftModel.from_pretrained(model.model, kev_dir)`), every question
  as its own row from position 0, final-norm hidden states (`last_hidden_state`), pointer head in fp32.
* `merged_bf16` — the weights a prepared export holds (`bf16(fp32(W) + (B@A)·alpha/r)` for adapted modules, every
  other tensor as stored), computed in float32.
* `torch_bf16` — the merged model cast to bfloat16 and run by torch in bfloat16; head in fp32 on `.float()` states.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

import torch

from . import contract as C
from . import release as R

ARMS = ("reference", "merged_bf16", "torch_bf16")


@dataclass
class Head:
    """The pointer head from `head.pt` (fp32)."""

    wq: torch.Tensor
    bq: torch.Tensor
    wk: torch.Tensor
    bk: torch.Tensor
    temperature: float
    head_dim: int
    meta: dict

    @classmethod
    def load(cls, path: Path) -> "Head":
        d = torch.load(str(path), map_location="cpu", weights_only=True)
        h = d["head"]
        return cls(h["q.weight"].float(), h["q.bias"].float(), h["k.weight"].float(), h["k.bias"].float(),
                   float(d["temperature"]), int(d["head_dim"]), {k: v for k, v in d.items() if k != "head"})

    def probs(self, hidden: torch.Tensor, option_ends: list[int], decide: int) -> list[float]:
        """kev-contract §6 on one row's hidden states `[len, d]` (any dtype; cast to fp32 first)."""
        h = hidden.float()
        q = torch.nn.functional.linear(h[decide], self.wq, self.bq)
        k = torch.nn.functional.linear(h[option_ends], self.wk, self.bk)
        z = (k @ q) * (self.head_dim ** -0.5) / self.temperature
        return torch.softmax(z, dim=-1).tolist()


def merged_state(base_dir: Path, kev_dir: Path) -> dict[str, torch.Tensor]:
    """The text backbone's state dict after PEFT's own merge on the fp32-loaded base (`merge_and_unload`), fp32."""
    from peft import PeftModel

    text = R.load_text_model(base_dir, torch.float32)
    pm = PeftModel.from_pretrained(text, str(kev_dir))
    merged = pm.merge_and_unload()
    return {k: v.detach().clone() for k, v in merged.state_dict().items()}


def adapted_names(kev_dir: Path) -> list[str]:
    """Backbone weight names (no prefix) that the adapter modifies."""
    from safetensors import safe_open

    names = set()
    with safe_open(str(kev_dir / "adapter_model.safetensors"), "pt") as f:
        for k in f.keys():
            if ".lora_A." in k:
                names.add(k.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight"))
    return sorted(names)


def load_arm(arm: str, base_dir: Path, kev_dir: Path) -> torch.nn.Module:
    """The text backbone of one arm, in eval mode. One at a time: the real 4B in fp32 needs ~17 GB."""
    from peft import PeftModel

    if arm == "reference":
        text = R.load_text_model(base_dir, torch.float32)
        return PeftModel.from_pretrained(text, str(kev_dir)).eval()
    if arm not in ("merged_bf16", "torch_bf16"):
        raise ValueError(f"unknown arm {arm!r}")
    text = R.load_text_model(base_dir, torch.float32)
    merged = PeftModel.from_pretrained(text, str(kev_dir)).merge_and_unload()
    if arm == "torch_bf16":
        return merged.to(torch.bfloat16).eval()
    adapted = set(adapted_names(kev_dir))
    with torch.no_grad():
        for name, p in merged.named_parameters():
            if name in adapted:
                p.copy_(p.to(torch.bfloat16).float())
    return merged.eval()


@torch.no_grad()
def row_hidden(model: torch.nn.Module, row_ids: list[int]) -> torch.Tensor:
    """Final-norm hidden states `[len, d]` of one row run from position 0, no cache."""
    ids = torch.tensor([row_ids], dtype=torch.long)
    return model(input_ids=ids, use_cache=False).last_hidden_state[0]


def run_arms(base_dir: Path, kev_dir: Path, compiled: list[C.Compiled], arms=ARMS,
             hidden_for: set[int] | None = None, log=None) -> list[dict]:
    """For each compiled request: `{arm: [probs per question]}` (+ `"hidden"`: reference readout states for the
    requests whose index is in `hidden_for`). Arms run one after the other so only one model is in memory."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    head = Head.load(kev_dir / "head.pt")
    hidden_for = hidden_for or set()
    out: list[dict] = [{"hidden": []} for _ in compiled]
    for arm in arms:
        model = load_arm(arm, base_dir, kev_dir)
        for i, c in enumerate(compiled):
            res = out[i].setdefault(arm, [])
            for q in c.questions:
                h = row_hidden(model, q.row_ids)
                res.append(head.probs(h, q.option_ends, q.decide))
                if arm == "reference" and i in hidden_for:
                    out[i]["hidden"].append(h[q.option_ends + [q.decide]].float().contiguous().clone())
        if log:
            log(f"arm {arm}: {len(compiled)} requests")
        del model
        gc.collect()
    return out
