"""Checkpoint files for model.py: a Hugging Face model directory that transformers 5.17 and megactx load.

  config.json             glm_moe_dsa config with indexer_types and mlp_layer_types written out
  model.safetensors       weights under the checkpoint names (model-spec §7.1), F32 or BF16 (the router's
                          e_score_correction_bias stays F32, as in the real checkpoints)
  generation_config.json  eos/pad/bos ids and GLM-5.2's default sampling (temperature 1.0, top_p 0.95)

The safetensors reader and writer are here (the format is an 8-byte header length, a JSON header, then the
raw little-endian tensor bytes), so exporting needs nothing beyond torch.

Usage as a library: save(model, out_dir, dtype="bf16"); model = load(dir).
"""
from __future__ import annotations

import json
import os
import struct

import torch

from model import Config, GlmMoeDsa

_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int32: "I32",
           torch.int64: "I64"}
_BY_NAME = {v: k for k, v in _DTYPES.items()}


def write_safetensors(path: str, tensors: dict, metadata: dict | None = None):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    header["__metadata__"] = metadata or {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # the data starts 8-byte aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)


def read_safetensors(path: str) -> dict:
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8: 8 + n])
    base, out = 8 + n, {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        dtype = _BY_NAME[h["dtype"]]
        t = torch.frombuffer(bytearray(data[base + a: base + b]), dtype=torch.uint8) if b > a else torch.empty(0,
                                                                                                   dtype=torch.uint8)
        out[name] = t.view(dtype).reshape(h["shape"])
    return out


def checkpoint_tensors(model: GlmMoeDsa, dtype: str = "bf16") -> dict:
    """Checkpoint names → tensors in the stored dtype (f32 or bf16; the selection bias is always F32)."""
    assert dtype in ("f32", "bf16")
    out = {}
    for k, v in model.checkpoint_state().items():
        keep_f32 = dtype == "f32" or k.endswith("e_score_correction_bias")
        out[k] = v.detach().float() if keep_f32 else v.detach().to(torch.bfloat16)
    return out


def save(model: GlmMoeDsa, out_dir: str, dtype: str = "bf16"):
    os.makedirs(out_dir, exist_ok=True)
    cfg = model.cfg.to_hf()
    cfg["dtype"] = "bfloat16" if dtype == "bf16" else "float32"
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    gen = {"bos_token_id": model.cfg.bos_token_id, "eos_token_id": model.cfg.eos_token_id,
           "pad_token_id": model.cfg.pad_token_id, "do_sample": True, "temperature": 1.0, "top_p": 0.95,
           "transformers_version": "5.17.0"}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), checkpoint_tensors(model, dtype))


def load(model_dir: str, device="cpu") -> GlmMoeDsa:
    """A model directory written by save() (or any single-file glm_moe_dsa checkpoint in F32/BF16)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = Config.from_hf(json.load(f))
    model = GlmMoeDsa(cfg)
    tensors = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    model.load_checkpoint_state(tensors)
    return model.to(device)


def main():
    """A training checkpoint → the model directory megactx ships: weights in bf16, config, generation config,
    and the tokenizer files and haystack copied in."""
    import argparse
    import shutil
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--ckpt", required=True, help="ckpt.safetensors from train.py (fp32, checkpoint names)")
    ap.add_argument("--config", required=True, help="the run's config.json")
    ap.add_argument("--tokenizer", required=True, help="directory with tokenizer.json and tokenizer_config.json")
    ap.add_argument("--haystack", default="", help="haystack.txt for `megactx eval niah`")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    a = ap.parse_args()
    with open(a.config) as f:
        cfg = Config.from_hf(json.load(f))
    model = GlmMoeDsa(cfg)
    model.load_checkpoint_state(read_safetensors(a.ckpt))
    save(model, a.out, a.dtype)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.tokenizer, name), os.path.join(a.out, name))
    if a.haystack:
        shutil.copy(a.haystack, os.path.join(a.out, "haystack.txt"))
    print(f"wrote {a.out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, {a.dtype}")


if __name__ == "__main__":
    main()
