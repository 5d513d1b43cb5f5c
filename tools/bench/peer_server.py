#!/usr/bin/env python3
"""mtplx's server against llama.cpp's, one client, the same GGUF file and threads, one run.

    peer_server.py MTPLX_SERVE LLAMA_SERVER MODEL.gguf [--threads 2] [--contexts 500,2000,6500]
                   [--rounds 3] [--gen 64] [--work DIR] [--mtplx-args '...'] [--llama-args '...']
                   [--engine '["xtask", "peer", "--mtplx-only", ...]'] [--client sdk|http]

Both servers run one at a time on the same machine (never both at once), each with
`--threads` compute threads and an 8,192-token window. For each context length the client
(the `openai` SDK, or with `--client http` a plain HTTP client that reads the stream's lines
and parses each chunk's JSON, nothing more; streaming `/v1/chat/completions`, temperature 0)
sends `--rounds` fresh
prompts (no prefix is shared between rounds, and llama.cpp is asked not to reuse its cache:
`cache_prompt: false`; mtplx decodes plainly: `generation_mode: "ar"`) and records time to
the first token (the prefill) and the decode rate after it (streamed chunks over time). The
medians are printed as a table with the ratio mtplx / llama.cpp (above 1: mtplx is faster)
and written as JSON to WORK/peer_server.json. With `--engine`, mtplx's engine in process is
measured at each context's prompt length right after the mtplx server's rounds there (the
server idle meanwhile), so the server and its engine are compared minutes apart, not the
length of the whole run.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import http.client
import urllib.parse


def prompt(tokens, seed):
    """About `tokens` tokens of agent-like text (a sentence is some 35 tokens), different
    for every seed."""
    words = []
    i = 0
    while len(words) < max(1, tokens // 35):
        words.append(
            f"Step {seed}.{i}: the tool read file src/module_{(seed * 31 + i) % 97}.rs "
            f"and found {i * 7 % 13} warnings in function f{i % 29}."
        )
        i += 1
    return " ".join(words)


def wait_ready(proc, url, log, timeout=600):
    import urllib.request

    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {open(log).read()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                if r.status == 200:
                    return json.load(r)["data"][0]["id"]
        except Exception:
            time.sleep(0.5)
    raise SystemExit(f"server not ready after {timeout}s")


class HttpClient:
    """The lightest client of a streaming chat completion: one connection a request, the
    response's lines read as they arrive, each `data:` chunk's JSON parsed."""

    def __init__(self, base_url):
        u = urllib.parse.urlsplit(base_url)
        self.host, self.port = u.hostname, u.port


def run_one_http(client, model, text, gen, extra):
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": text + "\nSummarise the warnings."}],
        "max_tokens": gen, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}, **extra,
    })
    t0 = time.time()
    conn = http.client.HTTPConnection(client.host, client.port, timeout=1200)
    conn.request("POST", "/v1/chat/completions", body,
                 {"Content-Type": "application/json", "Authorization": "Bearer x"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"HTTP {resp.status}: {resp.read()[:500]!r}")
    first, chunks, usage = None, 0, None
    for line in resp:
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        ch = json.loads(data)
        if ch.get("usage"):
            usage = ch["usage"]
        choices = ch.get("choices") or []
        if choices and (choices[0].get("delta") or {}).get("content"):
            if first is None:
                first = time.time()
            chunks += 1
    end = time.time()
    conn.close()
    completion = usage["completion_tokens"] if usage else chunks
    prompt_tokens = usage["prompt_tokens"] if usage else None
    decode = (completion - 1) / (end - first) if first and completion > 1 and end > first else None
    return {"ttft": (first or end) - t0, "decode": decode, "prompt_tokens": prompt_tokens,
            "completion_tokens": completion}


def run_one(client, model, text, gen, extra):
    if isinstance(client, HttpClient):
        return run_one_http(client, model, text, gen, extra)
    t0 = time.time()
    first = None
    chunks = 0
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": text + "\nSummarise the warnings."}],
        max_tokens=gen,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    )
    usage = None
    for ch in stream:
        if ch.usage is not None:
            usage = ch.usage
        if ch.choices and ch.choices[0].delta.content:
            if first is None:
                first = time.time()
            chunks += 1
    end = time.time()
    completion = usage.completion_tokens if usage else chunks
    prompt_tokens = usage.prompt_tokens if usage else None
    decode = (completion - 1) / (end - first) if first and completion > 1 and end > first else None
    return {"ttft": (first or end) - t0, "decode": decode, "prompt_tokens": prompt_tokens,
            "completion_tokens": completion}


def engine_at(args, depth):
    """mtplx's engine in process (`--engine`, a JSON argv that prints its figures as a JSON
    line), decoding after `depth` tokens: run between the mtplx server's rounds, while the
    server idles (its workers sleep), so both are measured minutes apart at most on a machine
    whose speed drifts."""
    out = subprocess.run(json.loads(args.engine) + ["--depths", str(depth)], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    figures = json.loads(out.strip().splitlines()[-1])
    return {"depth": depth, "decode": figures.get(f"tg{args.gen}@{depth}"), "figures": figures}


def bench(name, cmd, env, url, extra, args):
    log = os.path.join(args.work, f"{name}.log")
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    try:
        model = wait_ready(proc, url, log)
        if args.client == "http":
            client = HttpClient(url)
        else:
            from openai import OpenAI

            client = OpenAI(base_url=url + "/v1", api_key="x", timeout=1200)
        run_one(client, model, prompt(64, 999), 8, extra)  # warm-up
        out = {}
        for ctx in args.contexts:
            rows = [run_one(client, model, prompt(ctx, 1000 * ctx + r), args.gen, extra)
                    for r in range(args.rounds)]
            out[ctx] = rows
            print(f"[{name}] ctx {ctx}: " + ", ".join(
                f"ttft {r['ttft']:.2f}s decode {r['decode'] or 0:.1f} tok/s ({r['prompt_tokens']} prompt)"
                for r in rows), flush=True)
            if name == "mtplx" and args.engine:
                e = engine_at(args, rows[0]["prompt_tokens"])
                args.engine_rows[ctx] = e
                print(f"[engine] {e['depth']} tokens of context: decode {e['decode'] or 0:.1f} tok/s",
                      flush=True)
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mtplx")
    ap.add_argument("llama")
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", default="500,2000,6500")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--work", default="target/peer-server")
    ap.add_argument("--mtplx-args", default="", help="more mtplx-serve flags (e.g. '--kv-dtype q8')")
    ap.add_argument("--llama-args", default="", help="more llama-server flags (e.g. '-ctk q8_0')")
    ap.add_argument("--engine", default="",
                    help="mtplx's engine measurement, a JSON argv taking `--depths N`, run after "
                         "the mtplx server's rounds at each context")
    ap.add_argument("--client", choices=["sdk", "http"], default="sdk",
                    help="the openai SDK, or a plain HTTP client (the lightest on the CPU)")
    args = ap.parse_args()
    args.engine_rows = {}
    args.contexts = [int(c) for c in args.contexts.split(",")]
    os.makedirs(args.work, exist_ok=True)

    env = {**os.environ, "MTPLX_THREADS": str(args.threads), "MTPLX_HOME": os.path.join(args.work, "home")}
    mtplx = bench("mtplx", [args.mtplx, "--model", args.model, "--port", "18431", "--context-window", "8192",
                            "--ssd-session-cache", "off", *args.mtplx_args.split()],
                  env, "http://127.0.0.1:18431", {"generation_mode": "ar"}, args)
    llama = bench("llama.cpp", [args.llama, "-m", args.model, "--port", "18432", "-t", str(args.threads),
                                "-c", "8192", "-np", "1", *args.llama_args.split()],
                  dict(os.environ), "http://127.0.0.1:18432", {"cache_prompt": False}, args)

    med = lambda rows, k: statistics.median([r[k] for r in rows if r[k] is not None])
    print(f"\n{os.path.basename(args.model)}, {args.threads} threads, medians of {args.rounds} rounds")
    print(f"{'context':>8} {'prompt':>7} | {'TTFT mtplx':>10} {'llama.cpp':>10} {'ratio':>6} | "
          f"{'decode mtplx':>12} {'llama.cpp':>10} {'ratio':>6}")
    table = []
    for ctx in args.contexts:
        a, b = mtplx[ctx], llama[ctx]
        ta, tb, da, db = med(a, "ttft"), med(b, "ttft"), med(a, "decode"), med(b, "decode")
        e = args.engine_rows.get(ctx, {})
        table.append({"context": ctx, "prompt_tokens": a[0]["prompt_tokens"], "ttft_mtplx": ta,
                      "ttft_llama": tb, "decode_mtplx": da, "decode_llama": db,
                      "decode_engine": e.get("decode"), "engine_figures": e.get("figures")})
        print(f"{ctx:>8} {a[0]['prompt_tokens']!s:>7} | {ta:>9.2f}s {tb:>9.2f}s {tb / ta:>5.2f}x | "
              f"{da:>8.1f} t/s {db:>6.1f} t/s {da / db:>5.2f}x")
    json.dump({"model": args.model, "threads": args.threads, "rounds": args.rounds, "gen": args.gen,
               "client": args.client,
               "mtplx_args": args.mtplx_args, "llama_args": args.llama_args,
               "table": table, "mtplx": mtplx, "llama": llama},
              open(os.path.join(args.work, "peer_server.json"), "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
