#!/usr/bin/env python3
"""Train the default model's MTP head on a GPU (PyTorch), by self-distillation.

The recipe the shipped head (`models/mtp/smollm2-135m-mtp.safetensors`) came from; see the
README beside that file. `cargo xtask train-mtp` is the same idea on the CPU (candle) at a
scale a laptop can run; this script is the scale that makes a useful head.

Inputs (all made on the CPU machine, nothing downloaded):
  --gguf     the default model (SmolLM2-135M-Instruct.Q4_1.gguf)
  --corpus   the folder `cargo xtask mtp-corpus` writes (prompts.bin, texts.bin, meta.json)

Steps:
 1. The trunk, frozen, in f32 from the GGUF's dequantized weights (tools/reference's loader,
    Q/K kept in the GGUF's permuted layout with interleaved RoPE, as mtplx runs them). It
    must reproduce the Rust model's greedy tokens on meta.json's check prompt.
 2. The model's own text: greedy answers to every prompt (batched, KV-cached, up to
    --answer-tokens), cut after the first stop token.
 3. Features: the trunk's last hidden state (before the final norm) at every position of
    every sequence (answers and texts).
 4. The head (mtplx_model::mtp's graph: fc over [rms(embed(t+1)) ⊕ rms(h_t)], one Llama
    decoder layer with its own attention, final norm, the tied embedding as output head),
    trained recursively to depth --depth: depth d at position p reads the head's depth-(d-1)
    output and token p+d, attends to the depth-1 rows of positions <= p plus its own chain
    (exactly the cache MtpProposer holds when drafting), and learns the trunk's full
    distribution for token p+d+1 (KL). AdamW, cosine schedule, bf16 autocast.
 5. Shortlist: the 8192 tokens the trunk predicts most often on the corpus, most frequent
    first. Written as f16 safetensors under the mtp.* names, plus mtp.shortlist (int32).

Deterministic up to GPU reduction order (fixed seeds, fixed order).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "reference"))
sys.path.insert(0, HERE)  # a copy run from elsewhere keeps ref_model.py beside it
import ref_model as R  # noqa: E402

T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


def read_seqs(path):
    b = open(path, "rb").read()
    n = struct.unpack_from("<I", b, 0)[0]
    lens = np.frombuffer(b, "<u4", n, 4)
    toks = np.frombuffer(b, "<u2", offset=4 + 4 * n).astype(np.int64)
    out, o = [], 0
    for ln in lens:
        out.append(toks[o:o + ln])
        o += int(ln)
    return out


def rms(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, pos, inv_freq):
    """Interleaved RoPE (pairs 2i, 2i+1). x: [B, h, T, d]; pos: [B, T] (or [T])."""
    ang = pos.to(torch.float64)[..., None] * inv_freq  # [B, T, d/2]
    if ang.dim() == 2:
        ang = ang[None]
    cos = torch.cos(ang).to(x.dtype)[:, None]
    sin = torch.sin(ang).to(x.dtype)[:, None]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


class Trunk:
    def __init__(self, m: R.Model, dev):
        c = m.cfg
        self.c = c
        t = lambda a: torch.tensor(np.asarray(a, dtype=np.float32), device=dev)
        self.embed = t(m.embed)
        self.norm = t(m.norm)
        self.layers = [{k: t(v) for k, v in L.items()} for L in m.layers]
        self.inv_freq = torch.tensor(m.inv_freq, device=dev)
        self.dev = dev

    def _block(self, L, x, pos, kv, mask):
        """x [B, T, H]; kv: None or (K, V, start) cache slices to fill; mask [B,1,T,S] bool."""
        c = self.c
        B, T, H = x.shape
        nh, nkv, hd = c.n_heads, c.n_kv_heads, c.head_dim
        h = rms(x, L["attn_norm"], c.rms_eps)
        q = (h @ L["q"].T).view(B, T, nh, hd).transpose(1, 2)
        k = (h @ L["k"].T).view(B, T, nkv, hd).transpose(1, 2)
        v = (h @ L["v"].T).view(B, T, nkv, hd).transpose(1, 2)
        q, k = rope(q, pos, self.inv_freq), rope(k, pos, self.inv_freq)
        if kv is not None:
            K, V, s = kv
            K[:, :, s:s + T] = k
            V[:, :, s:s + T] = v
            k, v = K[:, :, :s + T], V[:, :, :s + T]
        g = nh // nkv
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + a.transpose(1, 2).reshape(B, T, nh * hd) @ L["o"].T
        h = rms(x, L["ffn_norm"], c.rms_eps)
        return x + (F.silu(h @ L["gate"].T) * (h @ L["up"].T)) @ L["down"].T

    @torch.no_grad()
    def hidden(self, ids):
        """Right-padded ids [B, T] -> last hidden before the final norm [B, T, H] (causal)."""
        B, T = ids.shape
        x = self.embed[ids]
        pos = torch.arange(T, device=self.dev)
        mask = torch.ones(T, T, dtype=torch.bool, device=self.dev).tril()[None, None]
        for L in self.layers:
            x = self._block(L, x, pos, None, mask)
        return x

    def logits(self, h):
        return rms(h, self.norm, self.c.rms_eps) @ self.embed.T

    @torch.no_grad()
    def generate(self, prompts, max_new, stop_ids):
        """Greedy answers for a batch of prompts (lists of ids), left-padded, KV-cached."""
        c = self.c
        B = len(prompts)
        P = max(len(p) for p in prompts)
        S = P + max_new
        ids = torch.zeros(B, P, dtype=torch.long, device=self.dev)
        valid = torch.zeros(B, S, dtype=torch.bool, device=self.dev)
        for i, p in enumerate(prompts):
            ids[i, P - len(p):] = torch.tensor(p, device=self.dev)
            valid[i, P - len(p):] = True
        valid[:, P:] = True
        cache = [
            (torch.zeros(B, c.n_kv_heads, S, c.head_dim, device=self.dev),
             torch.zeros(B, c.n_kv_heads, S, c.head_dim, device=self.dev))
            for _ in self.layers
        ]
        pos_all = (valid.long().cumsum(1) - 1).clamp(min=0)
        causal = torch.ones(S, S, dtype=torch.bool, device=self.dev).tril()
        # a padding row attends to itself alone (no row may be all masked: NaN)
        eye = torch.eye(S, dtype=torch.bool, device=self.dev)
        out = torch.zeros(B, max_new, dtype=torch.long, device=self.dev)
        done = torch.zeros(B, dtype=torch.bool, device=self.dev)
        stops = torch.tensor(stop_ids, device=self.dev)
        start, x_ids = 0, ids
        for step in range(max_new):
            T = x_ids.shape[1]
            pos = pos_all[:, start:start + T]
            mask = (causal[start:start + T, :start + T][None] & valid[:, None, :start + T])
            mask = (mask | eye[start:start + T, :start + T][None])[:, None]
            x = self.embed[x_ids]
            for L, (K, V) in zip(self.layers, cache):
                x = self._block(L, x, pos, (K, V, start), mask)
            nxt = self.logits(x[:, -1]).argmax(-1)
            out[:, step] = nxt
            done |= torch.isin(nxt, stops)
            start += T
            x_ids = nxt[:, None]
            if bool(done.all()):
                out = out[:, :step + 1]
                break
        res = []
        for i in range(B):
            a = out[i].tolist()
            for j, t in enumerate(a):
                if t in stop_ids:
                    a = a[:j + 1]
                    break
            res.append(a)
        return res


class Head(torch.nn.Module):
    """mtplx_model::mtp::MtpHead's graph, trainable."""

    def __init__(self, trunk: Trunk, seed: int):
        super().__init__()
        c = trunk.c
        H = c.hidden
        g = torch.Generator().manual_seed(seed)
        P = lambda t: torch.nn.Parameter(t.clone().float())
        last = trunk.layers[-1]
        fc = torch.zeros(H, 2 * H)
        fc[:, :H] = torch.randn(H, H, generator=g) * 0.02
        fc[:, H:] = torch.eye(H)
        self.fc = P(fc)
        self.norm_e = P(torch.ones(H))
        self.norm_h = P(torch.ones(H))
        self.L = torch.nn.ParameterDict({k: P(v.cpu()) for k, v in last.items()})
        self.norm = P(trunk.norm.cpu())
        self.c = c

    def layer_in(self, hid, emb):
        c = self.c
        x = torch.cat([rms(emb, self.norm_e, c.rms_eps), rms(hid, self.norm_h, c.rms_eps)], -1)
        return x @ self.fc.T

    def qkv(self, x, pos, inv_freq):
        c = self.c
        B, T, _ = x.shape
        L = self.L
        h = rms(x, L["attn_norm"], c.rms_eps)
        q = (h @ L["q"].T).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)
        k = (h @ L["k"].T).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = (h @ L["v"].T).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        return rope(q, pos, inv_freq), rope(k, pos, inv_freq), v

    def finish(self, x, a):
        c, L = self.c, self.L
        B, T = x.shape[:2]
        x = x + a.transpose(1, 2).reshape(B, T, -1) @ L["o"].T
        h = rms(x, L["ffn_norm"], c.rms_eps)
        return x + (F.silu(h @ L["gate"].T) * (h @ L["up"].T)) @ L["down"].T

    def out_hidden(self, o):
        return rms(o, self.norm, self.c.rms_eps)


def head_forward(head, trunk, hid, ids, depth):
    """Recursive teacher-forced passes over windows. hid [B,T,H] trunk hidden; ids [B,T].
    Returns the normed outputs of each depth d (1-based) at positions p = 0..T-1-d: [B, T-d, H]."""
    c = head.c
    B, T, H = hid.shape
    g = c.n_heads // c.n_kv_heads
    scale = 1.0 / math.sqrt(c.head_dim)
    E = trunk.embed
    pos = torch.arange(T, device=hid.device)
    outs = []
    # depth 1: rows p = 0..T-2, input (h_p, x_{p+1}) at position p, plain causal attention.
    x = head.layer_in(hid[:, :T - 1], E[ids[:, 1:]])
    q, k1, v1 = head.qkv(x, pos[:T - 1], trunk.inv_freq)
    K1 = k1.repeat_interleave(g, 1)
    V1 = v1.repeat_interleave(g, 1)
    a = F.scaled_dot_product_attention(q, K1, V1, is_causal=True)
    o = head.finish(x, a)
    outs.append(head.out_hidden(o))
    chain_k, chain_v = [], []
    n = T - 1
    for d in range(2, depth + 1):
        n = T - d  # rows p = 0..T-1-d
        # input (o_{d-1, p}, x_{p+d}) at position p+d-1
        x = head.layer_in(o[:, :n], E[ids[:, d:d + n]])
        q, k, v = head.qkv(x, pos[d - 1:d - 1 + n], trunk.inv_freq)
        chain_k = [ck[:, :, :n] for ck in chain_k] + [k.repeat_interleave(g, 1)]
        chain_v = [cv[:, :, :n] for cv in chain_v] + [v.repeat_interleave(g, 1)]
        # context: depth-1 rows j <= p
        s_ctx = (q.float() @ K1[:, :, :n].float().transpose(-1, -2)) * scale  # [B,h,n,n]
        s_ctx = s_ctx.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=q.device).tril(), float("-inf"))
        s_chain = torch.stack([(q.float() * ck.float()).sum(-1) * scale for ck in chain_k], -1)  # [B,h,n,c]
        p = torch.softmax(torch.cat([s_ctx, s_chain], -1), -1)
        a = p[..., :n].to(V1.dtype) @ V1[:, :, :n]
        for i, cv in enumerate(chain_v):
            a = a + p[..., n + i:n + i + 1].to(cv.dtype) * cv
        o = head.finish(x, a.to(x.dtype))
        outs.append(head.out_hidden(o))
    return outs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--answer-tokens", type=int, default=320)
    ap.add_argument("--gen-batch", type=int, default=384)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop training at this elapsed time")
    ap.add_argument("--shortlist", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--limit-prompts", type=int, default=0, help="smoke tests: only the first N prompts")
    ap.add_argument("--limit-texts", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    log("device", dev, torch.__version__)

    meta = json.load(open(os.path.join(a.corpus, "meta.json")))
    prompts = read_seqs(os.path.join(a.corpus, "prompts.bin"))
    texts = read_seqs(os.path.join(a.corpus, "texts.bin"))
    if a.limit_prompts:
        prompts = prompts[:a.limit_prompts]
    if a.limit_texts:
        texts = texts[:a.limit_texts]
    stop_ids = meta["stop_ids"]
    m = R.load_gguf(a.gguf, unpermute=False, dtype=np.float32)
    trunk = Trunk(m, dev)
    c = trunk.c
    log("trunk loaded", c.n_layers, "layers")

    # 1. The check.
    chk = meta["check"]
    got = trunk.generate([chk["prompt"]], len(chk["expected"]), stop_ids)[0]
    log("check: expected", chk["expected"], "got", got)
    if got[:4] != chk["expected"][:4]:
        raise SystemExit("the GPU trunk does not reproduce the Rust model's greedy tokens")

    # 2. Own answers, batched by prompt length.
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    answers = [None] * len(prompts)
    for s in range(0, len(order), a.gen_batch):
        idx = order[s:s + a.gen_batch]
        res = trunk.generate([prompts[i].tolist() for i in idx], a.answer_tokens, stop_ids)
        for i, r in zip(idx, res):
            answers[i] = r
    n_ans = sum(len(x) for x in answers)
    log(f"own answers: {len(prompts)} prompts, {n_ans} tokens")

    # Sequences and per-position weights (the head drafts inside answers; prompts and plain
    # text are context and count less).
    seqs, weights = [], []
    for p, ans in zip(prompts, answers):
        seqs.append(np.concatenate([p, np.array(ans, dtype=np.int64)]))
        weights.append(np.concatenate([np.full(len(p), 0.25), np.ones(len(ans))]))
    for t in texts:
        seqs.append(t)
        weights.append(np.full(len(t), 0.5))
    # Windows of a.window tokens (sequences cut, the tail padded).
    W = a.window
    win_ids, win_w = [], []
    for s, w in zip(seqs, weights):
        for o in range(0, max(1, len(s) - 1), W):
            part = s[o:o + W]
            if len(part) < 8:
                continue
            pad = W - len(part)
            win_ids.append(np.concatenate([part, np.zeros(pad, dtype=np.int64)]))
            win_w.append(np.concatenate([w[o:o + W], np.zeros(pad)]))
    ids_all = torch.tensor(np.stack(win_ids), device=dev)
    w_all = torch.tensor(np.stack(win_w), dtype=torch.float32, device=dev)
    N = ids_all.shape[0]
    log(f"{N} windows of {W} ({int((w_all > 0).sum())} positions)")

    # 3. Features.
    hid_all = torch.empty(N, W, c.hidden, device=dev)
    fb = 64
    for s in range(0, N, fb):
        hid_all[s:s + fb] = trunk.hidden(ids_all[s:s + fb])
    log("features done")

    # Shortlist: the trunk's most frequent predictions (and the tokens themselves).
    counts = torch.zeros(c.vocab, dtype=torch.long, device=dev)
    for s in range(0, N, fb):
        top = trunk.logits(hid_all[s:s + fb]).argmax(-1)
        m_ = w_all[s:s + fb] > 0
        counts += torch.bincount(top[m_], minlength=c.vocab)
        counts += torch.bincount(ids_all[s:s + fb][m_], minlength=c.vocab)
    shortlist = torch.argsort(-counts * c.vocab + torch.arange(c.vocab, device=dev))[: a.shortlist]

    # Held out: every 20th window.
    held = torch.arange(N, device=dev) % 20 == 0
    train_idx = torch.nonzero(~held).flatten()
    held_idx = torch.nonzero(held).flatten()

    head = Head(trunk, a.seed).to(dev)
    opt = torch.optim.AdamW(head.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warm = 50

    def lr_at(step):
        if step < warm:
            return a.lr * (step + 1) / warm
        t = (step - warm) / max(1, a.steps - warm)
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))

    depth_w = [1.0, 0.6, 0.4, 0.3][: a.depth]

    def losses(bi, train=True):
        ids = ids_all[bi]
        hid = hid_all[bi]
        w = w_all[bi]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            outs = head_forward(head, trunk, hid, ids, a.depth)
        total, stats = 0.0, []
        for d, o in enumerate(outs, start=1):
            n = W - d
            # target: the trunk's distribution at position p+d (predicting token p+d+1)
            with torch.no_grad():
                tl = torch.log_softmax(trunk.logits(hid[:, d:d + n]).float(), -1)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                hl = o[:, :n] @ trunk.embed.T
            hl = torch.log_softmax(hl.float(), -1)
            # weight: the target position must be real, the drafted token inside the window
            ww = w[:, d:d + n] * (w[:, :n] > 0)
            kl = (tl.exp() * (tl - hl)).sum(-1)
            loss = (kl * ww).sum() / ww.sum().clamp(min=1)
            total = total + depth_w[d - 1] * loss
            agree = ((hl.argmax(-1) == tl.argmax(-1)).float() * (ww > 0.9)).sum() / (ww > 0.9).sum().clamp(min=1)
            stats.append((float(loss.detach()), float(agree)))
        return total, stats

    def evaluate():
        head.eval()
        acc = np.zeros(a.depth)
        with torch.no_grad():
            tot = 0
            for s in range(0, len(held_idx), a.batch):
                bi = held_idx[s:s + a.batch]
                _, st = losses(bi, False)
                acc += np.array([x[1] for x in st]) * len(bi)
                tot += len(bi)
        head.train()
        return acc / max(1, tot)

    g = torch.Generator(device="cpu").manual_seed(a.seed)
    step, best, best_state = 0, -1.0, None
    perm = train_idx[torch.randperm(len(train_idx), generator=g).to(dev)]
    cursor = 0
    t_train = time.time()
    log(f"training: {len(train_idx)} train windows, {len(held_idx)} held out, depth {a.depth}")
    while step < a.steps and time.time() - T0 < a.budget_s:
        if cursor + a.batch > len(perm):
            perm = train_idx[torch.randperm(len(train_idx), generator=g).to(dev)]
            cursor = 0
        bi = perm[cursor:cursor + a.batch]
        cursor += a.batch
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step)
        loss, st = losses(bi)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        step += 1
        if step == 20:
            # Fit the schedule to the time budget.
            rate = (time.time() - t_train) / step
            fit = step + int((a.budget_s - (time.time() - T0)) / rate * 0.97)
            a.steps = max(step + 1, min(a.steps, fit))
            log(f"{rate * 1000:.0f} ms a step: {a.steps} steps")
        if step % 50 == 0 or step == 1:
            log(f"step {step} loss {float(loss):.4f} agree " + " ".join(f"{x[1]:.3f}" for x in st))
        if step % 250 == 0:
            ev = evaluate()
            score = float(ev.sum())
            log(f"held-out agreement by depth {np.round(ev, 3).tolist()}")
            if score > best:
                best, best_state = score, {k: v.detach().clone() for k, v in head.state_dict().items()}
    ev = evaluate()
    log(f"final held-out agreement by depth {np.round(ev, 3).tolist()} after {step} steps")
    if best_state is not None and float(ev.sum()) < best:
        head.load_state_dict(best_state)
        log("kept the best checkpoint", best)

    # 5. Export.
    from safetensors.torch import save_file

    f16 = lambda t: t.detach().to("cpu", torch.float16).contiguous()
    names = {
        "attn_norm": "input_layernorm.weight", "q": "self_attn.q_proj.weight",
        "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight",
        "o": "self_attn.o_proj.weight", "ffn_norm": "post_attention_layernorm.weight",
        "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight",
    }
    out = {f"mtp.layers.0.{v}": f16(head.L[k]) for k, v in names.items()}
    out["mtp.fc.weight"] = f16(head.fc)
    out["mtp.pre_fc_norm_embedding.weight"] = f16(head.norm_e)
    out["mtp.pre_fc_norm_hidden.weight"] = f16(head.norm_h)
    out["mtp.norm.weight"] = f16(head.norm)
    out["mtp.shortlist"] = shortlist.to("cpu", torch.int32).contiguous()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    save_file(out, a.out, metadata={
        "recipe": "xtask/mtp_gpu/train.py", "steps": str(step),
        "held_out_agreement": json.dumps(np.round(ev, 4).tolist()),
    })
    # A probe for mtplx's own test (crates/mtplx-spec/tests/mtp_probe.rs): the exported
    # (f16-rounded) head's depth-1 and depth-2 scores at one row of the check sequence, in
    # f32, so the Rust graph can be shown to compute what was trained.
    probe_ids = list(chk["prompt"]) + list(chk["expected"])
    head_f = Head(trunk, a.seed).to(dev)
    with torch.no_grad():
        for k_, v_ in head.state_dict().items():
            head_f.state_dict()[k_].copy_(v_.to(torch.float16).float())
        ids_t = torch.tensor([probe_ids], device=dev)
        hid_p = trunk.hidden(ids_t)
        outs = head_forward(head_f, trunk, hid_p, ids_t, 2)
        row = len(probe_ids) - 3
        probe = {"ids": probe_ids, "row": row}
        for d, o in enumerate(outs, start=1):
            lg = (o[0, row] @ trunk.embed.T).float()
            top = torch.topk(lg, 5)
            probe[f"depth{d}"] = {"ids": top.indices.tolist(), "scores": [round(float(x), 5) for x in top.values]}
    json.dump(probe, open(os.path.splitext(a.out)[0] + ".probe.json", "w"), indent=1)
    log("probe", probe)
    report = {
        "prompts": len(prompts), "answer_tokens": n_ans, "texts": len(texts), "windows": N,
        "positions": int((w_all > 0).sum()), "steps": step, "depth": a.depth,
        "held_out_agreement_by_depth": np.round(ev, 4).tolist(),
        "shortlist_coverage": float(counts[shortlist].sum() / counts.sum()),
        "seconds": time.time() - T0,
    }
    json.dump(report, open(os.path.splitext(a.out)[0] + ".json", "w"), indent=1)
    log("wrote", a.out, report)


if __name__ == "__main__":
    main()
