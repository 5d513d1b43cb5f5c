#!/usr/bin/env python3
"""mtplx's server on a GPU against llama.cpp's CUDA server, one client (`requests`, streaming
SSE: the GPU machine has no `openai` package), the same GGUF file, both alone in turn.

usage: gpu_server.py --mtplx BIN --model GGUF --work DIR [--llama BIN] [--out JSON]
                     [--sizes W,W,...] [--rounds N] [--gen N] [--modes ar,mtp]
                     [--parts mtplx,returning,llama]

1. Fresh prompts (`/v1/completions`, `ignore_eos`) of about 500, 4,000 and 7,500 tokens (a new prefix every round, so no
   prompt cache helps), temperature 0, 128 new tokens: TTFT, prefill tok/s (prompt tokens /
   TTFT), decode tok/s (tokens after the first / the time from the first to the last) and
   end_s (from the last token to the end of the stream), medians of rounds.
   mtplx plainly (`generation_mode: "ar"`) and with its default speculation; llama.cpp
   with `cache_prompt: false`.
2. A returning conversation of about 7,500 tokens on mtplx: turn 1, the session evicted
   to the SSD tier (a second session with a one-entry bank), SIGKILL once the write landed,
   a restart, turn 2: its TTFT against turn 2 on a server with the SSD tier off (the whole
   conversation prefilled again), and against llama.cpp's re-prefill of it. The answers of
   the restored and the re-prefilled turn must be the same text.
Prints one JSON object (also written to --out).
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import time

import requests

WORDS = ("agent tool call file diff test build error retry patch module crate server cache "
         "token prompt restore layout kernel thread memory device stream graph block row "
         "value offset header index commit review branch merge config flag option").split()


def text(n_words, seed):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


class Server:
    def __init__(self, name, argv, work, env=None):
        self.out_path = os.path.join(work, f"{name}.out")
        self.out = open(self.out_path, "w")
        self.p = subprocess.Popen(argv, stdout=self.out, stderr=subprocess.STDOUT,
                                  env={**os.environ, **(env or {})}, start_new_session=True)
        deadline = time.time() + 600
        while time.time() < deadline:
            t = open(self.out_path).read()
            for marker in ("on http://", "listening on http://"):
                if marker in t:
                    self.base = "http://" + t.split(marker)[1].split()[0].rstrip("/")
                    if self.ready():
                        models = requests.get(self.base + "/v1/models", timeout=10).json()
                        self.model = models["data"][0]["id"]
                        return
            if self.p.poll() is not None:
                raise SystemExit(f"{name} exited: {t[-3000:]}")
            time.sleep(0.1)
        raise SystemExit(f"{name} did not start: {open(self.out_path).read()[-3000:]}")

    def ready(self):
        try:
            return requests.get(self.base + "/health", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def stop(self, sig=signal.SIGTERM):
        self.p.send_signal(sig)
        try:
            self.p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def chat(server, messages, max_tokens, extra=None, headers=None):
    return stream(server, "/v1/chat/completions", {"messages": messages}, max_tokens, extra, headers)


def complete(server, prompt, max_tokens, extra=None):
    """A plain completion that ignores the end-of-text token: every round decodes
    `max_tokens` tokens, whatever the prompt."""
    return stream(server, "/v1/completions", {"prompt": prompt, "ignore_eos": True}, max_tokens, extra)


def stream(server, path, fields, max_tokens, extra=None, headers=None):
    body = {"model": server.model, **fields, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}
    t0 = time.time()
    first = last = None
    out = ""
    usage = None
    with requests.post(server.base + path, json=body, headers=headers or {},
                       stream=True, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            j = json.loads(data)
            if j.get("usage"):
                usage = j["usage"]
            for ch in j.get("choices") or []:
                c = (ch.get("delta") or {}).get("content") or ch.get("text")
                if c:
                    last = time.time()
                    first = first or last
                    out += c
    t1 = time.time()
    first = first or t1
    last = last or t1
    n = (usage or {}).get("completion_tokens", 0)
    p = (usage or {}).get("prompt_tokens", 0)
    return {"ttft_s": first - t0, "prompt_tokens": p, "completion_tokens": n,
            "prefill_tok_s": p / max(first - t0, 1e-9),
            # From the first token to the last: what the stream's reader sees of the decoding.
            # What follows the last token (mtplx commits the conversation to its session
            # bank before it ends the stream) is `end_s`, apart.
            "decode_tok_s": (n - 1) / (last - first) if n > 1 and last > first else None,
            "end_s": t1 - last,
            "text": out}


def contexts(server, label, extra, rounds, gen, sizes, seed):
    rows = []
    for words in sizes:
        runs = []
        for k in range(rounds + 1):  # the first round warms up (graph capture, clocks)
            prompt = f"Session {seed}-{words}-{k}. " + text(words, seed * 1000 + k)
            r = complete(server, prompt, gen, extra)
            if k:
                runs.append(r)
        med = lambda key: statistics.median(x[key] for x in runs if x[key] is not None)
        rows.append({"server": label, "words": words, "prompt_tokens": runs[0]["prompt_tokens"],
                     "ttft_s": med("ttft_s"), "prefill_tok_s": med("prefill_tok_s"),
                     "decode_tok_s": med("decode_tok_s"), "end_s": med("end_s"),
                     "completion_tokens": [x["completion_tokens"] for x in runs],
                     "texts": [x["text"] for x in runs]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mtplx", required=True)
    ap.add_argument("--mtplx-base",
                    help="another mtplx-serve binary (e.g. main's, beside a branch's): the returning "
                         "part's restore then runs with each in turn, twice, from the same SSD entry")
    ap.add_argument("--llama")
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", default="target/gpu-server")
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--sizes", default="380,3000,5600", help="words of the fresh prompts")
    ap.add_argument("--llama-ctx", type=int, default=8192, help="llama.cpp's -c (its window)")
    ap.add_argument("--device", default="cuda", help="mtplx's --device (cpu to try the script)")
    ap.add_argument("--modes", default="ar,mtp",
                    help="mtplx's decoding in the mtplx part: plain (ar), its default speculation (mtp)")
    ap.add_argument("--parts", default="mtplx,returning,llama",
                    help="which parts run (llama also needs --llama): a slow model's parts can "
                         "go in separate calls")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    os.makedirs(args.work, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    result = {"model": os.path.basename(args.model), "contexts": [], "returning": {}}
    home = os.path.join(args.work, "home")

    def mtplx(name, extra_args, binary=None):
        return Server(name, [binary or args.mtplx, "--model", args.model, "--device", args.device, "--port", "0",
                             "--ssd-session-cache-dir", os.path.join(args.work, "ssd"),
                             "--ssd-session-cache-free-disk-floor", "0",
                             "--request-log-jsonl", os.path.join(args.work, f"{name}.jsonl")] + extra_args,
                      args.work, {"MTPLX_HOME": home})

    if "mtplx" in parts:
        s = mtplx("mtplx", ["--ssd-session-cache", "off"])
        result["startup"] = open(s.out_path).read().splitlines()[0]
        modes = args.modes.split(",")
        if "ar" in modes:
            result["contexts"] += contexts(s, "mtplx ar", {"generation_mode": "ar"}, args.rounds, args.gen, sizes, 1)
        if "mtp" in modes:
            result["contexts"] += contexts(s, "mtplx mtp", {}, args.rounds, args.gen, sizes, 2)
        s.stop()

    # The returning conversation.
    system = "You are a coding agent. " + text(sizes[-1], 99)
    q1 = [{"role": "system", "content": system}, {"role": "user", "content": "What failed first?"}]
    # The second turn llama.cpp re-prefills: mtplx's, or a fixed one without that part.
    q2 = q1 + [{"role": "assistant", "content": "The build."}, {"role": "user", "content": "And then?"}]
    if "returning" in parts:
        q2 = returning(args, mtplx, q1, result)
    if args.llama and "llama" in parts:
        s = Server("llama", [args.llama, "-m", args.model, "-ngl", "99", "-c", str(args.llama_ctx), "-np", "1",
                             "--port", "18123", "--host", "127.0.0.1"], args.work)
        result["contexts"] += contexts(s, "llama.cpp", {"cache_prompt": False}, args.rounds, args.gen, sizes, 3)
        r = chat(s, q2, 32, {"cache_prompt": False})
        result["returning"]["llama_reprefill_ttft_s"] = r["ttft_s"]
        s.stop()
    out = json.dumps(result, indent=1)
    print(out)
    if args.out:
        open(args.out, "w").write(out)


def request_log(args, name):
    """The lines of server `name`'s request log (`--request-log-jsonl`)."""
    return [json.loads(l) for l in open(os.path.join(args.work, f"{name}.jsonl")) if l.strip()]


def spill_landed(server, timeout=300):
    """Waits until the SSD tier has written everything the bank spilled (its write backlog
    empty, no entry spilling or unwritten): the SIGKILL then comes after the write, as the
    never-lost promise is stated. Returns the seconds waited (a fixed sleep was too short for
    a 4 GB entry on some hosts). agent_replay.py's `wait_written` is its twin; this script
    can't import it (that module needs the `openai` package, which the GPU machine lacks),
    and here at least one write must have been committed."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        st = requests.get(server.base + "/admin/cache/ssd", timeout=10).json()
        bank = st.get("bank", {})
        if st.get("backlog_bytes", 0) == 0 and not bank.get("spilling_entries") \
                and not bank.get("unwritten_entries") and bank.get("writes_committed", 0) >= 1:
            return time.time() - t0
        time.sleep(0.2)
    raise SystemExit(f"the spill did not land in {timeout} s: {st}")


def returning(args, mtplx, q1, result):
    """Turn 1, eviction to the SSD tier, SIGKILL, restart, turn 2 restored; against turn 2
    re-prefilled with the tier off."""
    s = mtplx("one", ["--session-bank-max-entries", "1", "--ssd-session-cache-idle-write-s", "0"])
    t1 = chat(s, q1, 32, headers={"x-session-id": "agent"})
    q2 = q1 + [{"role": "assistant", "content": t1["text"]}, {"role": "user", "content": "And then?"}]
    chat(s, [{"role": "user", "content": "hello"}], 4, headers={"x-session-id": "other"})
    landed_s = spill_landed(s)
    s.stop(signal.SIGKILL)
    s = mtplx("two", [])
    restored = chat(s, q2, 32, headers={"x-session-id": "agent"})
    s.stop()
    # The same restore by each binary in turn (the entry stays on the SSD): an A/B in one run.
    variants = []
    if args.mtplx_base:
        for i in range(2):
            for tag, binary in (("base", args.mtplx_base), ("this", args.mtplx)):
                name = f"again-{tag}-{i}"
                s = mtplx(name, [], binary)
                r = chat(s, q2, 32, headers={"x-session-id": "agent"})
                s.stop()
                last = (request_log(args, name) or [{}])[-1]
                variants.append({"binary": tag, "ttft_s": r["ttft_s"], "restore_s": last.get("restore_s"),
                                 "ssd_read": last.get("ssd_read"),
                                 "session_restore_mode": last.get("session_restore_mode"),
                                 "same_answer": r["text"] == restored["text"]})
                print(json.dumps(variants[-1]), flush=True)
    s = mtplx("cold", ["--ssd-session-cache", "off"])
    cold = chat(s, q2, 32, headers={"x-session-id": "agent"})
    s.stop()
    log = request_log(args, "two")
    result["returning"] = {
        "prompt_tokens": restored["prompt_tokens"],
        "turn1_ttft_s": t1["ttft_s"],
        "restored_after_sigkill_ttft_s": restored["ttft_s"],
        "reprefill_ttft_s": cold["ttft_s"],
        "speedup": cold["ttft_s"] / restored["ttft_s"],
        "spill_landed_s": landed_s,
        "same_answer": restored["text"] == cold["text"],
        "log": log,
        "restores_by_binary": variants,
    }
    print(json.dumps(result["returning"]), flush=True)
    return q2


if __name__ == "__main__":
    main()
