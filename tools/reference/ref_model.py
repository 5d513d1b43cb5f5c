#!/usr/bin/env python3
"""Plain-numpy reference forward pass for Llama / Qwen2 / Qwen3 decoder-only models.

Independent of the mtplx Rust code and of candle: weights are read with the
`gguf` PyPI package (GGUFReader + gguf.quants.dequantize) or with a ~30-line
hand-written safetensors parser, and every op (RMSNorm, RoPE, GQA attention,
SwiGLU MLP) is written out below in numpy.  Default compute dtype is float64.

Conventions (all in the Hugging Face layout):
  * linear weights are (out_features, in_features); y = x @ W.T (+ b)
  * RoPE is the HF "rotate_half" (NEOX) convention: the head vector is split in
    two halves [x1 | x2] and pair (i, i + d/2) is rotated by angle
    pos * theta^(-2i/d).  llama.cpp's GGUF conversion of *llama* models permutes
    the Q/K rows so that its interleaved RoPE (pairs 2i, 2i+1) is equivalent;
    the GGUF loader un-permutes Q/K back to the HF layout (unpermute=True), or
    keeps the GGUF layout and uses interleaved RoPE (unpermute=False).  Both
    give the same logits up to float rounding (checked by make_fixtures.py).
    Qwen2/Qwen3 GGUFs are not permuted (llama.cpp uses NEOX RoPE for them).
  * Qwen2: q/k/v projections have biases.  Qwen3: per-head RMSNorm on q and k
    (weights of size head_dim) applied after the projection, before RoPE.

CLI:  python ref_model.py MODEL (gguf file or HF folder) --ids 1,2,3 [--steps N]
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from dataclasses import dataclass, field, asdict

import numpy as np


# --------------------------------------------------------------------------
# config / weights
# --------------------------------------------------------------------------
@dataclass
class Config:
    arch: str                 # "llama" | "qwen2" | "qwen3"
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rms_eps: float
    rope_theta: float
    qkv_bias: bool
    qk_norm: bool
    tied: bool
    bos_id: int | None = None
    eos_id: int | None = None
    rope_style: str = "neox"  # "neox" (HF rotate_half) | "interleaved" (pairs 2i,2i+1)
    source: dict = field(default_factory=dict)  # metadata keys actually read


class Model:
    """cfg + weights.  layers[i] is a dict with keys
    attn_norm, q, k, v, o, [q_b, k_b, v_b], [q_norm, k_norm], ffn_norm, gate, up, down.
    """

    def __init__(self, cfg: Config, embed, norm, lm_head, layers, dtype=np.float64):
        self.cfg = cfg
        self.embed = embed
        self.norm = norm
        self.lm_head = lm_head  # None when tied
        self.layers = layers
        self.dtype = np.dtype(dtype)
        hd = cfg.head_dim
        self.inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))

    def astype(self, dtype) -> "Model":
        c = lambda a: None if a is None else a.astype(dtype)
        layers = [{k: c(v) for k, v in L.items()} for L in self.layers]
        return Model(self.cfg, c(self.embed), c(self.norm), c(self.lm_head), layers, dtype)

    # ---------------------------------------------------------------- ops
    def _rms(self, x, w):
        x = x.astype(self.dtype, copy=False)
        var = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(var + self.dtype.type(self.cfg.rms_eps)) * w

    def _rope(self, x, pos):
        """x: (heads, T, hd); pos: (T,) absolute positions."""
        ang = np.outer(pos.astype(np.float64), self.inv_freq)  # (T, hd/2), float64 always
        cos = np.cos(ang).astype(self.dtype)
        sin = np.sin(ang).astype(self.dtype)
        hd = x.shape[-1]
        if self.cfg.rope_style == "neox":
            x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
            return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        elif self.cfg.rope_style == "interleaved":
            x1, x2 = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2] = x1 * cos - x2 * sin
            out[..., 1::2] = x2 * cos + x1 * sin
            return out
        raise ValueError(self.cfg.rope_style)

    @staticmethod
    def _silu(x):
        return x / (1.0 + np.exp(-x))

    def new_cache(self):
        return KVCache(self.cfg.n_layers)

    def forward(self, ids, cache: "KVCache | None" = None, all_logits=False):
        """Run `ids` (list of ints) after what is already in `cache`.
        Returns logits of the last position (vocab,), or (T, vocab) if all_logits."""
        cfg = self.cfg
        if cache is None:
            cache = self.new_cache()
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        start = cache.length
        pos = np.arange(start, start + T)
        x = self.embed[ids].astype(self.dtype)                    # (T, H)
        nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        group = nh // nkv
        scale = self.dtype.type(1.0 / np.sqrt(hd))
        # causal mask for the new block (cached positions are all visible)
        mask = np.triu(np.ones((T, T), dtype=bool), k=1)
        for li, L in enumerate(self.layers):
            h = self._rms(x, L["attn_norm"])
            q = h @ L["q"].T
            k = h @ L["k"].T
            v = h @ L["v"].T
            if cfg.qkv_bias:
                q = q + L["q_b"]
                k = k + L["k_b"]
                v = v + L["v_b"]
            q = q.reshape(T, nh, hd).transpose(1, 0, 2)           # (nh, T, hd)
            k = k.reshape(T, nkv, hd).transpose(1, 0, 2)          # (nkv, T, hd)
            v = v.reshape(T, nkv, hd).transpose(1, 0, 2)
            if cfg.qk_norm:
                q = self._rms(q, L["q_norm"])
                k = self._rms(k, L["k_norm"])
            q = self._rope(q, pos)
            k = self._rope(k, pos)
            K, V = cache.append(li, k, v)                         # (nkv, S, hd)
            S = K.shape[1]
            attn = np.empty((nh, T, hd), dtype=self.dtype)
            for hh in range(nh):
                kv = hh // group
                s = (q[hh] @ K[kv].T) * scale                     # (T, S)
                s[:, S - T:][mask] = -np.inf
                s = s - s.max(axis=-1, keepdims=True)
                p = np.exp(s)
                p /= p.sum(axis=-1, keepdims=True)
                attn[hh] = p @ V[kv]
            attn = attn.transpose(1, 0, 2).reshape(T, nh * hd)
            x = x + attn @ L["o"].T
            h = self._rms(x, L["ffn_norm"])
            g = h @ L["gate"].T
            u = h @ L["up"].T
            x = x + (self._silu(g) * u) @ L["down"].T
        cache.length += T
        if not all_logits:
            x = x[-1:]
        x = self._rms(x, self.norm)
        W = self.embed if self.lm_head is None else self.lm_head
        logits = x @ W.astype(self.dtype, copy=False).T
        return logits if all_logits else logits[0]

    def greedy(self, prompt_ids, n_new, eos_ids=(), cache=None):
        """Greedy decode.  Returns dict(tokens, margins, first_logits, stopped_on_eos).
        margins[i] = top1 - top2 logit at step i (the step that produced tokens[i])."""
        cache = cache or self.new_cache()
        logits = self.forward(prompt_ids, cache)
        first = logits.copy()
        toks, margins, stopped = [], [], False
        for step in range(n_new):
            t = int(np.argmax(logits))
            top2 = np.partition(logits, -2)[-2:]
            margins.append(float(top2.max() - top2.min()))
            toks.append(t)
            if t in eos_ids:
                stopped = True
                break
            if step + 1 < n_new:
                logits = self.forward([t], cache)
        return dict(tokens=toks, margins=margins, first_logits=first, stopped_on_eos=stopped)


class KVCache:
    def __init__(self, n_layers):
        self.k = [None] * n_layers
        self.v = [None] * n_layers
        self.length = 0

    def append(self, li, k, v):
        if self.k[li] is None:
            self.k[li], self.v[li] = k, v
        else:
            self.k[li] = np.concatenate([self.k[li], k], axis=1)
            self.v[li] = np.concatenate([self.v[li], v], axis=1)
        return self.k[li], self.v[li]


# --------------------------------------------------------------------------
# GGUF loader
# --------------------------------------------------------------------------
def _gguf_field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _unpermute(w, n_head):
    """Inverse of llama.cpp convert_hf_to_gguf.LlamaModel.permute:
    gguf = hf.reshape(n_head, 2, d/2, in).swapaxes(1, 2).reshape(...)"""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf(path, unpermute=True, dtype=np.float64) -> Model:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(path)
    arch = _gguf_field(r, "general.architecture")
    if arch not in ("llama", "qwen2", "qwen3"):
        raise ValueError(f"unsupported arch {arch}")
    keys = {
        "general.architecture": arch,
        f"{arch}.block_count": _gguf_field(r, f"{arch}.block_count"),
        f"{arch}.embedding_length": _gguf_field(r, f"{arch}.embedding_length"),
        f"{arch}.feed_forward_length": _gguf_field(r, f"{arch}.feed_forward_length"),
        f"{arch}.attention.head_count": _gguf_field(r, f"{arch}.attention.head_count"),
        f"{arch}.attention.head_count_kv": _gguf_field(r, f"{arch}.attention.head_count_kv"),
        f"{arch}.attention.key_length": _gguf_field(r, f"{arch}.attention.key_length"),
        f"{arch}.rope.freq_base": _gguf_field(r, f"{arch}.rope.freq_base"),
        f"{arch}.rope.dimension_count": _gguf_field(r, f"{arch}.rope.dimension_count"),
        f"{arch}.attention.layer_norm_rms_epsilon": _gguf_field(r, f"{arch}.attention.layer_norm_rms_epsilon"),
        f"{arch}.vocab_size": _gguf_field(r, f"{arch}.vocab_size"),
        "tokenizer.ggml.bos_token_id": _gguf_field(r, "tokenizer.ggml.bos_token_id"),
        "tokenizer.ggml.eos_token_id": _gguf_field(r, "tokenizer.ggml.eos_token_id"),
    }
    tensors = {t.name: t for t in r.tensors}

    def get(name):
        t = tensors[name]
        a = dequantize(t.data, t.tensor_type)  # numpy layout = reversed ggml dims = (out, in)
        a = np.asarray(a, dtype=np.float32).reshape([int(d) for d in reversed(t.shape.tolist())])
        return a.astype(dtype)

    n_layers = int(keys[f"{arch}.block_count"])
    hidden = int(keys[f"{arch}.embedding_length"])
    nh = int(keys[f"{arch}.attention.head_count"])
    nkv = int(keys[f"{arch}.attention.head_count_kv"] or nh)
    hd = int(keys[f"{arch}.attention.key_length"] or hidden // nh)
    embed = get("token_embd.weight")
    vocab = embed.shape[0]
    tied = "output.weight" not in tensors
    permuted = arch == "llama"
    cfg = Config(
        arch=arch, n_layers=n_layers, hidden=hidden, n_heads=nh, n_kv_heads=nkv, head_dim=hd,
        ffn=int(keys[f"{arch}.feed_forward_length"]), vocab=vocab,
        rms_eps=float(keys[f"{arch}.attention.layer_norm_rms_epsilon"]),
        rope_theta=float(keys[f"{arch}.rope.freq_base"] or 10000.0),
        qkv_bias=f"blk.0.attn_q.bias" in tensors, qk_norm=f"blk.0.attn_q_norm.weight" in tensors,
        tied=tied, bos_id=keys["tokenizer.ggml.bos_token_id"], eos_id=keys["tokenizer.ggml.eos_token_id"],
        rope_style="neox" if (not permuted or unpermute) else "interleaved",
        source={k: v for k, v in keys.items() if v is not None},
    )
    layers = []
    for i in range(n_layers):
        p = f"blk.{i}."
        L = dict(attn_norm=get(p + "attn_norm.weight"), q=get(p + "attn_q.weight"), k=get(p + "attn_k.weight"),
                 v=get(p + "attn_v.weight"), o=get(p + "attn_output.weight"), ffn_norm=get(p + "ffn_norm.weight"),
                 gate=get(p + "ffn_gate.weight"), up=get(p + "ffn_up.weight"), down=get(p + "ffn_down.weight"))
        if permuted and unpermute:
            L["q"] = _unpermute(L["q"], nh)
            L["k"] = _unpermute(L["k"], nkv)
        if cfg.qkv_bias:
            for n in ("q", "k", "v"):
                L[n + "_b"] = get(p + f"attn_{n}.bias")
            if permuted and unpermute:
                L["q_b"] = _unpermute(L["q_b"], nh)
                L["k_b"] = _unpermute(L["k_b"], nkv)
        if cfg.qk_norm:
            L["q_norm"] = get(p + "attn_q_norm.weight")
            L["k_norm"] = get(p + "attn_k_norm.weight")
        layers.append(L)
    norm = get("output_norm.weight")
    lm_head = None if tied else get("output.weight")
    return Model(cfg, embed, norm, lm_head, layers, dtype)


# --------------------------------------------------------------------------
# Hugging Face folder loader (config.json + *.safetensors)
# --------------------------------------------------------------------------
_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    """Hand-written safetensors parser: u64 LE header length, JSON header, raw little-endian data."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        s, e = info["data_offsets"]
        raw = buf[base + s: base + e]
        shape = info["shape"]
        if info["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, dtype=np.dtype(_ST_DTYPES[info["dtype"]]).newbyteorder("<"))
        out[name] = a.reshape(shape)
    return out


def load_hf(folder, dtype=np.float64) -> Model:
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    mt = c["model_type"]
    if mt not in ("llama", "qwen2", "qwen3"):
        raise ValueError(f"unsupported model_type {mt}")
    W = {}
    for fn in sorted(os.listdir(folder)):
        if fn.endswith(".safetensors"):
            W.update(read_safetensors(os.path.join(folder, fn)))
    g = lambda n: W[n].astype(dtype)
    nh = c["num_attention_heads"]
    hd = c.get("head_dim") or c["hidden_size"] // nh
    tied = "lm_head.weight" not in W
    if tied and not c.get("tie_word_embeddings", True):
        raise ValueError("config says tie_word_embeddings=false but lm_head.weight is missing")
    qkv_bias = mt == "qwen2" or bool(c.get("attention_bias", False))
    cfg = Config(
        arch=mt, n_layers=c["num_hidden_layers"], hidden=c["hidden_size"], n_heads=nh,
        n_kv_heads=c.get("num_key_value_heads", nh), head_dim=hd, ffn=c["intermediate_size"],
        vocab=c["vocab_size"], rms_eps=c["rms_norm_eps"], rope_theta=c.get("rope_theta", 10000.0),
        qkv_bias=qkv_bias, qk_norm=mt == "qwen3", tied=tied,
        bos_id=c.get("bos_token_id"), eos_id=c.get("eos_token_id"), rope_style="neox",
        source={"config.json": {k: c[k] for k in sorted(c)}},
    )
    layers = []
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        L = dict(attn_norm=g(p + "input_layernorm.weight"), q=g(p + "self_attn.q_proj.weight"),
                 k=g(p + "self_attn.k_proj.weight"), v=g(p + "self_attn.v_proj.weight"),
                 o=g(p + "self_attn.o_proj.weight"), ffn_norm=g(p + "post_attention_layernorm.weight"),
                 gate=g(p + "mlp.gate_proj.weight"), up=g(p + "mlp.up_proj.weight"), down=g(p + "mlp.down_proj.weight"))
        if qkv_bias:
            for n in ("q", "k", "v"):
                L[n + "_b"] = g(p + f"self_attn.{n}_proj.bias")
        if cfg.qk_norm:
            L["q_norm"] = g(p + "self_attn.q_norm.weight")
            L["k_norm"] = g(p + "self_attn.k_norm.weight")
        layers.append(L)
    return Model(cfg, g("model.embed_tokens.weight"), g("model.norm.weight"),
                 None if tied else g("lm_head.weight"), layers, dtype)


def load(path, dtype=np.float64, **kw) -> Model:
    if os.path.isdir(path):
        return load_hf(path, dtype)
    return load_gguf(path, dtype=dtype, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--ids", required=True, help="comma-separated prompt token ids")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--f32", action="store_true")
    a = ap.parse_args()
    m = load(a.model, np.float32 if a.f32 else np.float64)
    ids = [int(x) for x in a.ids.split(",")]
    eos = () if m.cfg.eos_id is None else (m.cfg.eos_id,)
    out = m.greedy(ids, a.steps, eos)
    top = np.argsort(-out["first_logits"])[:10]
    print(json.dumps({"config": {k: v for k, v in asdict(m.cfg).items() if k != "source"},
                      "tokens": out["tokens"], "margins": out["margins"],
                      "first_top10": [[int(i), float(out["first_logits"][i])] for i in top]}, indent=1))


if __name__ == "__main__":
    main()
