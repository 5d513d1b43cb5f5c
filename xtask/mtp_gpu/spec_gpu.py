#!/usr/bin/env python3
"""What the shipped MTP head would buy where a verify block costs about one decode step.

mtplx runs on the CPU only, where a verify block of k + 1 rows is compute-bound and costs
1.2-2x a decode step (models/mtp/README.md). This script measures the same trunk (f32 from
the GGUF, as train.py runs it) and the same shipped head on a GPU, in eager PyTorch, batch
1, greedy: plain decoding against MTP drafting at depths 1-3, over the speculation bench's
prompts (bench_prompts.json: `crates/mtplx-spec/benches/speculation.rs`'s chat and
code-editing turns, rendered and tokenized by mtplx; the ids printed by
`cargo run --release -p mtplx-model --example generate`).

It is a measurement of the method on that hardware, not of mtplx: eager PyTorch pays a
kernel launch per operation, as a candle CUDA backend would. The head drafts exactly as
mtplx_spec::MtpProposer does: observed rows (trunk hidden h_p, token p+1) run the head's
layer into its own K/V cache; a draft starts from the newest observed row and recurses on
the head's raw output and its own draft token at the next position, attending to the
cached rows plus its own chain; its output head is the tied embedding restricted to
mtp.shortlist. Verification is greedy (accept while the trunk's argmax equals the draft),
so speculative output should equal plain output (GPU reductions may differ by row count;
the script reports how many tokens agree).

  python3 spec_gpu.py --gguf MODEL --head smollm2-135m-mtp.safetensors [--tokens 48]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train as T  # noqa: E402  (Trunk, Head, rms, rope, and the reference loader as T.R)

LAYER_NAMES = {
    "attn_norm": "input_layernorm.weight", "q": "self_attn.q_proj.weight",
    "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight",
    "o": "self_attn.o_proj.weight", "ffn_norm": "post_attention_layernorm.weight",
    "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight",
}


class TrunkCache:
    """The trunk's K/V for batch 1: [1, kv_heads, capacity, head_dim] per layer."""

    def __init__(self, trunk: T.Trunk, capacity: int):
        c = trunk.c
        z = lambda: torch.zeros(1, c.n_kv_heads, capacity, c.head_dim, device=trunk.dev)
        self.kv = [(z(), z()) for _ in trunk.layers]
        self.len = 0


@torch.no_grad()
def trunk_forward(trunk: T.Trunk, cache: TrunkCache, ids: list[int]):
    """Runs `ids` at positions cache.len.., appending their K/V. Returns hidden [n, H] (before
    the final norm) and logits [n, vocab]."""
    dev = trunk.dev
    n, s = len(ids), cache.len
    x = trunk.embed[torch.tensor(ids, device=dev)][None]
    pos = torch.arange(s, s + n, device=dev)
    mask = torch.ones(n, s + n, dtype=torch.bool, device=dev).tril(s)[None, None]
    for L, (K, V) in zip(trunk.layers, cache.kv):
        x = trunk._block(L, x, pos, (K, V, s), mask)
    cache.len += n
    return x[0], trunk.logits(x[0])


class HeadState:
    """MtpProposer's state: the head's depth-1 K/V rows, and the newest row's raw output."""

    def __init__(self, head: T.Head, trunk: T.Trunk, capacity: int, shortlist):
        c = head.c
        z = lambda: torch.zeros(1, c.n_kv_heads, capacity, c.head_dim, device=trunk.dev)
        self.K, self.V, self.len = z(), z(), 0
        self.head, self.trunk = head, trunk
        self.short = shortlist
        self.short_emb = trunk.embed[shortlist]
        self.last = None  # (raw output [H], position)

    def _attend(self, q, ks, vs):
        g = self.head.c.n_heads // self.head.c.n_kv_heads
        k = torch.cat(ks, 2).repeat_interleave(g, 1)
        v = torch.cat(vs, 2).repeat_interleave(g, 1)
        return F.scaled_dot_product_attention(q, k, v)

    @torch.no_grad()
    def observe(self, hidden, next_ids: list[int]):
        """Rows p = self.len.. with the trunk's hidden h_p and token p + 1."""
        h, tr = self.head, self.trunk
        n, s = len(next_ids), self.len
        x = h.layer_in(hidden[None], tr.embed[torch.tensor(next_ids, device=tr.dev)][None])
        q, k, v = h.qkv(x, torch.arange(s, s + n, device=tr.dev), tr.inv_freq)
        self.K[:, :, s:s + n], self.V[:, :, s:s + n] = k, v
        g = h.c.n_heads // h.c.n_kv_heads
        mask = torch.ones(n, s + n, dtype=torch.bool, device=tr.dev).tril(s)[None, None]
        a = F.scaled_dot_product_attention(
            q, self.K[:, :, :s + n].repeat_interleave(g, 1),
            self.V[:, :, :s + n].repeat_interleave(g, 1), attn_mask=mask)
        o = h.finish(x, a)
        self.len += n
        self.last = (o[0, -1], s + n - 1)

    def _pick(self, o):
        return int(self.short[(self.head.out_hidden(o) @ self.short_emb.T).argmax()])

    @torch.no_grad()
    def draft(self, k: int) -> list[int]:
        h, tr = self.head, self.trunk
        o, p = self.last
        out = [self._pick(o)]
        ks, vs = [self.K[:, :, :p + 1]], [self.V[:, :, :p + 1]]
        for d in range(2, k + 1):
            x = h.layer_in(o[None, None], tr.embed[out[-1]][None, None])
            q, kk, vv = h.qkv(x, torch.tensor([p + d - 1], device=tr.dev), tr.inv_freq)
            ks.append(kk)
            vs.append(vv)
            o = h.finish(x, self._attend(q, ks, vs))[0, 0]
            out.append(self._pick(o))
        return out


def load_head(trunk: T.Trunk, path: str):
    st = T.R.read_safetensors(path)
    head = T.Head(trunk, 0).to(trunk.dev)
    f = lambda a: torch.tensor(np.asarray(a, dtype=np.float32), device=trunk.dev)
    with torch.no_grad():
        for k, name in LAYER_NAMES.items():
            head.L[k].copy_(f(st[f"mtp.layers.0.{name}"]))
        head.fc.copy_(f(st["mtp.fc.weight"]))
        head.norm_e.copy_(f(st["mtp.pre_fc_norm_embedding.weight"]))
        head.norm_h.copy_(f(st["mtp.pre_fc_norm_hidden.weight"]))
        head.norm.copy_(f(st["mtp.norm.weight"]))
    shortlist = torch.tensor(np.asarray(st["mtp.shortlist"], dtype=np.int64), device=trunk.dev)
    return head, shortlist


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def plain(trunk, ids, n):
    """Greedy decoding of n tokens; like `speculative`, the prompt's last token is run in
    the timed part (it gives the first new token)."""
    cache = TrunkCache(trunk, len(ids) + n + 8)
    trunk_forward(trunk, cache, ids[:-1])
    out = [ids[-1]]
    sync(trunk.dev)
    t = time.perf_counter()
    while len(out) <= n:
        _, logits = trunk_forward(trunk, cache, out[-1:])
        out.append(int(logits[-1].argmax()))
    sync(trunk.dev)
    return out[1:], time.perf_counter() - t


def speculative(trunk, head, shortlist, ids, n, depth):
    """Greedy speculative decoding as mtplx_spec::SpecDecoder does it. Returns the tokens,
    the decode time, and (verify calls, accepted drafts by depth)."""
    cap = len(ids) + n + depth + 8
    cache = TrunkCache(trunk, cap)
    hs = HeadState(head, trunk, cap, shortlist)
    # Prefill all but the last prompt token; the head sees those rows.
    hidden, _ = trunk_forward(trunk, cache, ids[:-1])
    hs.observe(hidden, ids[1:])
    tokens = list(ids)
    stats = {"verifies": 0, "accepted": [0] * depth}
    sync(trunk.dev)
    t = time.perf_counter()
    new = 0
    while new < n:
        k = min(depth, n - new - 1)
        drafts = hs.draft(k) if k > 0 else []
        hidden, logits = trunk_forward(trunk, cache, [tokens[-1]] + drafts)
        top = logits.argmax(-1).tolist()
        emitted = []
        for i in range(k + 1):
            emitted.append(top[i])
            if i == k or top[i] != drafts[i]:
                break
            stats["accepted"][i] += 1
        stats["verifies"] += k > 0
        cut = len(emitted)
        # Keep the K/V of what precedes the newest token (as SpecDecoder truncates).
        cache.len = len(tokens) - 1 + cut
        hs.observe(hidden[:cut], emitted)
        tokens += emitted
        new += cut
    sync(trunk.dev)
    return tokens[len(ids):len(ids) + n], time.perf_counter() - t, stats


def step_costs(trunk, head, shortlist, ids, reps=50):
    """Median time of a forward pass of n rows after the prompt, and of drafting one token
    from an observed row (`head_step`: the shortlist's scores; the head's layer runs when a
    row is observed, inside the speculative loop's time)."""
    out = {}
    for n in range(1, 6):
        cache = TrunkCache(trunk, len(ids) + 16)
        trunk_forward(trunk, cache, ids)
        times = []
        for _ in range(reps):
            cache.len = len(ids)
            sync(trunk.dev)
            t = time.perf_counter()
            _, lg = trunk_forward(trunk, cache, list(range(300, 300 + n)))
            int(lg[-1].argmax())
            sync(trunk.dev)
            times.append(time.perf_counter() - t)
        out[f"rows{n}"] = float(np.median(times))
    hs = HeadState(head, trunk, len(ids) + 16, shortlist)
    cache = TrunkCache(trunk, len(ids) + 16)
    hidden, _ = trunk_forward(trunk, cache, ids)
    hs.observe(hidden[:-1], ids[1:])
    times = []
    for _ in range(reps):
        sync(trunk.dev)
        t = time.perf_counter()
        hs.draft(1)
        sync(trunk.dev)
        times.append(time.perf_counter() - t)
    out["head_step"] = float(np.median(times))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--prompts", default=os.path.join(HERE, "bench_prompts.json"))
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (a smoke test)")
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() and not a.cpu else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 products, as the trunk's reference
    m = T.R.load_gguf(a.gguf, unpermute=False, dtype=np.float32)
    trunk = T.Trunk(m, dev)
    head, shortlist = load_head(trunk, a.head)
    sets = json.load(open(a.prompts))
    print(f"device {dev} ({torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}), "
          f"torch {torch.__version__}, {a.tokens} new tokens, median of {a.rounds}", flush=True)
    costs = step_costs(trunk, head, shortlist, sets["chat"][0]["ids"])
    one = costs["rows1"]
    print("forward of n rows: " + ", ".join(
        f"{n} {costs[f'rows{n}'] * 1e3:.2f} ms ({costs[f'rows{n}'] / one:.2f}x)" for n in range(1, 6))
        + f"; first draft token {costs['head_step'] * 1e3:.2f} ms ({costs['head_step'] / one:.2f}x:"
        " the shortlist's scores only, the head's layer ran when its row was observed)",
        flush=True)
    report = {"device": str(dev), "costs": costs, "sets": {}}
    for name, prompts in sets.items():
        ids = [p["ids"] for p in prompts]
        for p in ids:  # warm-up
            plain(trunk, p, 4)
            speculative(trunk, head, shortlist, p, 4, 3)
        times = {"plain": []}
        same = {}
        acc = {}
        for _ in range(a.rounds):
            want = []
            t = 0.0
            for p in ids:
                toks, dt = plain(trunk, p, a.tokens)
                want.append(toks)
                t += dt
            times["plain"].append(t)
            for depth in (1, 2, 3):
                key = f"mtp/{depth}"
                t, agree, verifies, accepted = 0.0, 0, 0, [0] * depth
                for p, w in zip(ids, want):
                    toks, dt, st = speculative(trunk, head, shortlist, p, a.tokens, depth)
                    t += dt
                    agree += sum(x == y for x, y in zip(toks, w))
                    verifies += st["verifies"]
                    accepted = [x + y for x, y in zip(accepted, st["accepted"])]
                times.setdefault(key, []).append(t)
                same[key] = agree
                acc[key] = [round(x / max(verifies, 1), 3) for x in accepted]
        base = float(np.median(times["plain"]))
        total = a.tokens * len(ids)
        print(f"[{name}] plain {base * 1e3:.1f} ms ({total / base:.0f} tok/s)", flush=True)
        rows = {"plain_ms": base * 1e3}
        for key in [k for k in times if k != "plain"]:
            m_ = float(np.median(times[key]))
            print(f"[{name}] {key}: {m_ * 1e3:.1f} ms, {base / m_:.2f}x plain; accepted per verify "
                  f"by depth {acc[key]}; tokens equal to plain {same[key]}/{total}", flush=True)
            rows[key] = {"ms": m_ * 1e3, "speedup": base / m_, "accepted_by_depth": acc[key],
                         "tokens_equal": same[key], "tokens": total}
        report["sets"][name] = rows
    json.dump(report, open(os.environ.get("OUT", ".") + "/spec_gpu.json", "w"), indent=1)


if __name__ == "__main__":
    main()
