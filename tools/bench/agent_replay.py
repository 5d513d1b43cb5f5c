#!/usr/bin/env python3
"""An agent session replayed against real servers, one client (`cargo xtask bench` runs it).

    agent_replay.py --serve MTPLX_SERVE --model MODEL.gguf --work DIR --out RESULTS.json
                    [--llama LLAMA_SERVER] [--quick] [--turns 24] [--seed 7] [--threads 2]
                    [--window 8192] [--gen 48] [--parts replay,reprefill,decoding,peer]

The scenario is written once, from the seed, before any server starts, and every part replays
the same one:
- a system prompt with the agent's tool definitions (JSON schemas), shared by two sessions;
- session "main" takes `--turns` turns, session "side" one turn after every second turn of
  main, interleaved; each turn after the first is a tool result: a real file of this
  machine's Python standard library (a slice of it), a `grep -n` over several of them, an
  `ls -l` of a package, or `wc -l` of a few files, chosen by the seed, sized so that main's
  prompt grows from about 1K tokens to near the window;
- between turns the client waits the think time of a tool run (0-3 s, seeded; a tenth of
  that with --quick);
- the assistant messages in the history are the server's own answers (temperature 0), as
  an agent would send them.

Parts (each a fresh server process with its own SSD folder):
- replay: mtplx as users run it, its RAM bank capped at one entry so that every switch of
  session evicts the other to the SSD tier; killed with SIGKILL and restarted between two
  turns of main (once its conversations are on the SSD tier), the next turn restoring from
  it; then the whole replay again (repeatability: outputs compared byte for byte);
- reprefill: the same replay with the session cache off (bank and SSD tier), the
  re-prefill baseline; its outputs must equal the replay's (temperature 0, whichever way the
  prefix arrived);
- decoding: plain decoding against each proposer (the MTP head, prompt lookup) and the
  default policy, on chat and code-editing turns of the scenario;
- peer: llama.cpp's llama-server on the same file and threads, its prompt cache on, the
  same replay through the same client.

Per turn: TTFT, prefill and decode tok/s, restore mode, cached tokens, SSD bytes, restore
seconds, the server's RSS (and its peak); RSS is also sampled every 0.25 s. Everything goes
to RESULTS.json; progress goes to the terminal.
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.request

from openai import OpenAI

CHARS_PER_TOKEN = 3.2  # a conservative guess for code in byte-level BPE: prompts stay below plan

TOOLS = [
    {"name": "read_file", "description": "Read a file of the repository, or a range of its lines.",
     "parameters": {"type": "object", "properties": {
         "path": {"type": "string"}, "start_line": {"type": "integer"}, "end_line": {"type": "integer"}},
         "required": ["path"]}},
    {"name": "grep", "description": "Search files for a regular expression; prints path:line: text.",
     "parameters": {"type": "object", "properties": {
         "pattern": {"type": "string"}, "paths": {"type": "array", "items": {"type": "string"}}},
         "required": ["pattern"]}},
    {"name": "list_dir", "description": "List a directory like `ls -l`: sizes and names.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "run", "description": "Run a shell command in the repository and return its output.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
    {"name": "edit_file", "description": "Replace the text `old` with `new` in a file.",
     "parameters": {"type": "object", "properties": {
         "path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
         "required": ["path", "old", "new"]}},
]

SYSTEM = (
    "You are a coding agent working in a Python repository. You act through tools; reply with "
    "one short sentence of reasoning and then one tool call as JSON, "
    '{"tool": NAME, "arguments": {...}}, or with a final answer when the task is done. '
    "Keep edits minimal and explain nothing you were not asked.\n\nTools:\n"
    + "\n".join(json.dumps(t, sort_keys=True) for t in TOOLS)
)


def log(msg):
    print(f"[bench] {msg}", flush=True)


# ---------------------------------------------------------------- the scenario, from the seed

def source_files():
    """The Python standard library's modules, largest first cut off, sorted by path."""
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for dirpath, dirnames, names in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("test", "tests", "idlelib", "site-packages",
                                                               "__pycache__", "lib2to3", "tkinter"))
        for n in sorted(names):
            if n.endswith(".py"):
                p = os.path.join(dirpath, n)
                try:
                    text = open(p, encoding="utf-8").read()
                except (UnicodeDecodeError, OSError):
                    continue
                if 2_000 <= len(text) and text.isascii():
                    files.append((os.path.relpath(p, root), text))
    if len(files) < 20:
        raise SystemExit(f"too few source files under {root}")
    return root, files


def tool_result(rng, files, budget_chars):
    """One tool call and its output, at most about `budget_chars` characters."""
    kind = rng.choice(["read_file", "read_file", "grep", "list_dir", "wc"])
    if kind == "read_file":
        path, text = rng.choice(files)
        lines = text.splitlines()
        start = rng.randrange(0, max(1, len(lines) - 40))
        out, end = [], start
        while end < len(lines) and sum(len(l) + 7 for l in out) < budget_chars:
            out.append(f"{end + 1:>5}  {lines[end]}")
            end += 1
        return ({"tool": "read_file", "arguments": {"path": path, "start_line": start + 1, "end_line": end}},
                "\n".join(out))
    if kind == "grep":
        word = rng.choice(["def ", "return None", "raise ", "self._", "import ", "yield", "except ", "lambda"])
        out = []
        for path, text in rng.sample(files, 8):
            for i, line in enumerate(text.splitlines()):
                if word in line:
                    out.append(f"{path}:{i + 1}: {line.strip()}")
        text = ""
        for line in out:
            if len(text) + len(line) + 1 > budget_chars:
                break
            text += line + "\n"
        return ({"tool": "grep", "arguments": {"pattern": word, "paths": ["."]}}, text.rstrip())
    if kind == "list_dir":
        dirs = sorted({os.path.dirname(p) or "." for p, _ in files})
        d = rng.choice(dirs)
        rows = [f"-rw-r--r-- 1 agent agent {len(t):>8} {os.path.basename(p)}"
                for p, t in files if (os.path.dirname(p) or ".") == d]
        text = "\n".join(rows)[:budget_chars]
        return ({"tool": "list_dir", "arguments": {"path": d}}, f"total {len(rows)}\n{text}")
    chosen = rng.sample(files, 12)
    rows = [f"{t.count(chr(10)):>7} {p}" for p, t in chosen]
    rows.append(f"{sum(t.count(chr(10)) for _, t in chosen):>7} total")
    return ({"tool": "run", "arguments": {"command": "wc -l " + " ".join(p for p, _ in chosen)}},
            "\n".join(rows)[:budget_chars])


def scenario(seed, turns, window, gen, quick):
    """The turns of both sessions, in the order they are sent."""
    rng = random.Random(seed)
    root, files = source_files()
    system_tokens = len(SYSTEM) / CHARS_PER_TOKEN
    # Main's prompt: ~1K tokens at its first turn, growing to ~80% of the window at its last
    # (answers included), in equal steps; the side session takes half the steps.
    target = (0.8 * window - turns * (gen + 12)) if not quick else min(2_000, 0.5 * window)
    first = min(1_000, target / 2) if not quick else 300
    step_tokens = max(50, (target - first) / max(1, turns - 1))
    tasks = [
        ("main", "The test suite fails in the module that parses configuration files. Find the bug "
                 "and fix it; keep the public API as it is."),
        ("side", "Add type hints to the helper functions of the logging setup, and nothing else."),
    ]
    order = []
    side_turns = 0
    for t in range(turns):
        order.append(("main", t))
        if t % 2 == 1:
            order.append(("side", side_turns))
            side_turns += 1
    sessions = {}
    for name, task in tasks:
        path, text = rng.choice(files)
        opening = text[: int(max(0, first - system_tokens - 40) * CHARS_PER_TOKEN)]
        sessions[name] = {"task": task, "opening_file": path,
                          "first": f"{task}\n\nThe file you will start from, {path}:\n```python\n{opening}\n```"}
    steps = []
    for name, t in order:
        if t == 0:
            user = sessions[name]["first"]
            call = None
            kind = "chat"
        else:
            call, output = tool_result(rng, files, int(step_tokens * CHARS_PER_TOKEN))
            # Every third turn asks for an edit of code in the prompt (prompt lookup's case).
            kind = "code_edit" if t % 3 == 2 else "chat"
            ask = ("Now rewrite the first function shown above with type hints; reply with the whole "
                   "function as code." if kind == "code_edit" else "What next?")
            user = f"Tool result for {json.dumps(call)}:\n```\n{output}\n```\n{ask}"
        think = rng.uniform(0, 3) * (0.1 if quick else 1)
        steps.append({"session": name, "turn": t, "kind": kind, "user": user, "think_s": think})
    return {"seed": seed, "source_root": root, "source_files": len(files), "system": SYSTEM,
            "sessions": sessions, "steps": steps}


# ---------------------------------------------------------------- servers

class Server:
    """A server process on loopback, with its RSS sampled while it runs."""

    def __init__(self, name, cmd, env, port, work):
        self.name, self.cmd, self.env, self.port, self.work = name, cmd, env, port, work
        self.url = f"http://127.0.0.1:{port}"
        self.rss = []  # (t, bytes) over the run
        self.t0 = time.time()
        self.proc = None
        self.starts = 0

    def start(self):
        self.starts += 1
        out = open(os.path.join(self.work, f"{self.name}.{self.starts}.log"), "w")
        self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        t0 = time.time()
        while time.time() - t0 < 900:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited at start: " + open(out.name).read()[-3000:])
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    self.model = json.load(r)["data"][0]["id"]
                    break
            except Exception:
                time.sleep(0.2)
        else:
            raise SystemExit(f"{self.name} not ready after 900 s")
        self.client = OpenAI(base_url=self.url + "/v1", api_key="x", timeout=1800, max_retries=0)
        self.sampling = True
        threading.Thread(target=self._sample, args=(self.proc,), daemon=True).start()
        return time.time() - t0

    def _sample(self, proc):
        while self.sampling and proc.poll() is None:
            r = rss(proc.pid)
            if r:
                self.rss.append((round(time.time() - self.t0, 3), r[0]))
            time.sleep(0.25)

    def stop(self, sig=signal.SIGTERM):
        self.sampling = False
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return json.load(r)


def rss(pid):
    """(VmRSS, VmHWM) in bytes, or None."""
    try:
        fields = dict(l.split(":", 1) for l in open(f"/proc/{pid}/status") if ":" in l)
        return tuple(int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM"))
    except (OSError, KeyError, ValueError):
        return None


def mtplx_server(args, name, port, extra):
    work = os.path.join(args.work, name)
    os.makedirs(work, exist_ok=True)
    env = {**os.environ, "MTPLX_THREADS": str(args.threads), "MTPLX_HOME": os.path.join(work, "home")}
    cmd = [args.serve, "--model", args.model, "--port", str(port), "--context-window", str(args.window),
           "--ssd-session-cache-dir", os.path.join(work, "ssd"), "--ssd-session-cache-free-disk-floor", "0",
           "--request-log-jsonl", os.path.join(work, "requests.jsonl"), *extra]
    return Server(name, cmd, env, port, work)


def request_log(server):
    path = os.path.join(server.work, "requests.jsonl")
    if not os.path.exists(path):
        return {}
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return {r.get("request_id"): r for r in rows}


# ---------------------------------------------------------------- the client

def turn(server, messages, gen, session, rid, extra):
    t0 = time.time()
    first, text, usage, timings = None, "", None, None
    stream = server.client.chat.completions.create(
        model=server.model, messages=messages, max_tokens=gen, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=extra,
        extra_headers={"x-session-id": session, "x-request-id": rid})
    for ch in stream:
        if ch.usage is not None:
            usage = ch.usage
        extra_fields = getattr(ch, "model_extra", None) or {}
        if extra_fields.get("timings"):
            timings = extra_fields["timings"]
        if ch.choices and ch.choices[0].delta.content:
            if first is None:
                first = time.time()
            text += ch.choices[0].delta.content
    end = time.time()
    completion = usage.completion_tokens if usage else None
    prompt = usage.prompt_tokens if usage else None
    cached = None
    if usage is not None and getattr(usage, "prompt_tokens_details", None) is not None:
        cached = usage.prompt_tokens_details.cached_tokens
    if timings and cached is None:
        cached = timings.get("cache_n")
    ttft = (first or end) - t0
    decode = (completion - 1) / (end - first) if first and completion and completion > 1 and end > first else None
    # Prefill rate as the client sees it: the prompt tokens the server had to compute over the TTFT.
    prefill = (prompt - (cached or 0)) / ttft if prompt and ttft > 0 else None
    return {"ttft_s": ttft, "decode_tok_s": decode, "prefill_tok_s": prefill, "prompt_tokens": prompt,
            "cached_tokens": cached, "completion_tokens": completion, "text": text, "wall_s": end - t0}


def wait_written(server, limit_s=60):
    """Until the SSD tier holds every conversation the bank has (nothing spilling or unwritten)."""
    t0 = time.time()
    while time.time() - t0 < limit_s:
        s = server.get("/admin/cache/ssd")
        b = s.get("bank", {})
        if b.get("unwritten_entries", 0) == 0 and b.get("spilling_entries", 0) == 0 \
                and s.get("backlog_bytes", 0) == 0:
            return time.time() - t0
        time.sleep(0.1)
    return None


def replay(server, sc, args, label, kill_before=None, extra=None, is_mtplx=True):
    """Every step of the scenario through `server` (already started); returns the turns."""
    extra = extra or {}
    history = {name: [{"role": "system", "content": sc["system"]}] for name in sc["sessions"]}
    rows = []
    n = len(sc["steps"])
    for k, step in enumerate(sc["steps"]):
        name = step["session"]
        restarted = None
        if kill_before is not None and k == kill_before:
            waited = wait_written(server)
            log(f"{label}: SIGKILL before turn {k + 1} (SSD writes done after {waited} s), restart")
            server.stop(signal.SIGKILL)
            restarted = {"waited_for_writes_s": waited, "start_s": server.start()}
        msgs = history[name] + [{"role": "user", "content": step["user"]}]
        rid = f"{label}-{k}"
        log(f"{label}: turn {k + 1}/{n} ({name} #{step['turn']}, {step['kind']})")
        r = turn(server, msgs, args.gen, f"{args.seed}-{name}", rid, extra)
        r.update({"step": k, "session": name, "turn": step["turn"], "kind": step["kind"],
                  "t": round(time.time() - server.t0, 3)})
        if restarted:
            r["restart"] = restarted
        mem = rss(server.proc.pid)
        if mem:
            r["rss_bytes"], r["rss_peak_bytes"] = mem
        if is_mtplx:
            try:
                ssd = server.get("/admin/cache/ssd")
                r["ssd_used_bytes"] = ssd.get("used_bytes")
                r["entries_lost"] = ssd.get("bank", {}).get("entries_lost")
            except Exception as e:  # the tier may be off
                r["ssd_used_bytes"] = None
        rows.append(r)
        history[name] = msgs + [{"role": "assistant", "content": r["text"]}]
        log(f"{label}:   prompt {r['prompt_tokens']} cached {r['cached_tokens']} ttft {r['ttft_s']:.2f}s "
            f"decode {r['decode_tok_s'] or 0:.1f} tok/s")
        time.sleep(step["think_s"])
    if is_mtplx:
        logged = request_log(server)
        for r in rows:
            e = logged.get(f"{label}-{r['step']}") or {}
            for key in ("session_restore_mode", "cache_source", "cache_miss_reason", "restore_s",
                        "ssd_cached_tokens", "new_prefill_tokens", "prompt_tps", "status", "proposer",
                        "mean_acceptance_length"):
                r[key] = e.get(key)
    return rows


# ---------------------------------------------------------------- parts

def part_replay(args, sc, port):
    """mtplx as users run it, the bank capped to one entry; a SIGKILL mid-way; twice."""
    runs = []
    for i in (1, 2):
        s = mtplx_server(args, f"mtplx-replay-{i}", port,
                         ["--session-bank-max-entries", "1", *args.mtplx_args.split()])
        s.start()
        kill = kill_step(sc)
        try:
            rows = replay(s, sc, args, f"replay{i}", kill_before=kill)
        finally:
            s.stop()
        runs.append({"turns": rows, "rss": s.rss, "kill_before_step": kill})
    return runs


def kill_step(sc):
    """The step of main just past the middle of the replay (its session's cache on the SSD)."""
    steps = sc["steps"]
    mid = len(steps) // 2
    for k in range(mid, len(steps)):
        if steps[k]["session"] == "main" and steps[k]["turn"] > 0:
            return k
    return None


def part_reprefill(args, sc, port):
    s = mtplx_server(args, "mtplx-reprefill", port,
                     ["--session-bank-max-bytes", "0", "--ssd-session-cache", "off", *args.mtplx_args.split()])
    s.start()
    try:
        rows = replay(s, sc, args, "reprefill")
    finally:
        s.stop()
    return {"turns": rows, "rss": s.rss}


def part_decoding(args, sc, port):
    """Plain vs each proposer vs the default policy, on the scenario's first chat and
    code-edit turns of main, each sent as the system prompt and that turn's user message
    (prefilled once by a short warm-up request, so the measured request decodes only)."""
    picks = []
    for kind in ("chat", "code_edit"):
        ks = [k for k, st in enumerate(sc["steps"]) if st["session"] == "main" and st["kind"] == kind
              and st["turn"] > 0][: (1 if args.quick else 3)]
        picks += ks
    configs = [
        ("plain", [], {"generation_mode": "ar"}),
        # The model's MTP head (the server's default one), drafting at full depth always.
        ("mtp-head", ["--adaptive-policy", "none"], {}),
        ("prompt-lookup", ["--mtp-head", "none", "--adaptive-policy", "none"], {}),
        ("default-policy", [], {}),
    ]
    out = {}
    for name, flags, extra in configs:
        s = mtplx_server(args, f"mtplx-decoding-{name}", port,
                         ["--ssd-session-cache", "off", *flags, *args.mtplx_args.split()])
        s.start()
        rows = []
        try:
            for k in picks:
                st = sc["steps"][k]
                msgs = [{"role": "system", "content": sc["system"]}, {"role": "user", "content": st["user"]}]
                gen = args.gen * 2
                turn(s, msgs, 8, f"warm-{name}-{k}", f"decwarm-{name}-{k}", extra)  # prefill once, cached
                r = turn(s, msgs, gen, f"warm-{name}-{k}", f"dec-{name}-{k}", extra)
                r.update({"step": k, "kind": st["kind"]})
                rows.append(r)
                log(f"decoding {name}: step {k + 1} ({st['kind']}) {r['decode_tok_s'] or 0:.1f} tok/s")
        finally:
            s.stop()
        logged = request_log(s)
        for r in rows:
            e = logged.get(f"dec-{name}-{r['step']}") or {}
            r["proposer"] = e.get("proposer")
            r["mean_acceptance_length"] = e.get("mean_acceptance_length")
        out[name] = rows
    return out


def has_amx():
    try:
        return "amx_int8" in open("/proc/cpuinfo").read()
    except OSError:
        return False


def part_peer(args, sc, port):
    work = os.path.join(args.work, "llama")
    os.makedirs(work, exist_ok=True)
    notes = []
    if has_amx():
        # xtask builds llama.cpp without its AMX code on such a CPU (ggml's AMX matmul
        # segfaults at the first decode on this project's AMX VMs): see peer.rs's isa_flags.
        notes.append("built without its AMX code (it crashes on this machine), for every other extension of this CPU")
    cmd = [args.llama, "-m", args.model, "--port", str(port), "-t", str(args.threads), "-c", str(args.window),
           "-np", "1", *args.llama_args.split()]
    s = Server("llama", cmd, dict(os.environ), port, work)
    s.start()
    try:
        rows = replay(s, sc, args, "llama", extra={"cache_prompt": True}, is_mtplx=False)
    finally:
        s.stop()
    return {"turns": rows, "rss": s.rss, "command": cmd, "notes": notes}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", required=True)
    ap.add_argument("--llama")
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--turns", type=int, default=24)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--window", type=int, default=8192)
    ap.add_argument("--gen", type=int, default=48)
    ap.add_argument("--port", type=int, default=18441)
    ap.add_argument("--parts", default="replay,reprefill,decoding,peer")
    ap.add_argument("--mtplx-args", default="")
    ap.add_argument("--llama-args", default="")
    ap.add_argument("--keep", action="store_true",
                    help="keep the parts of an existing --out of the same scenario that --parts does not name")
    args = ap.parse_args()
    parts = args.parts.split(",")
    os.makedirs(args.work, exist_ok=True)
    sc = scenario(args.seed, args.turns, args.window, args.gen, args.quick)
    log(f"scenario: {len(sc['steps'])} turns over 2 sessions, tool results from {sc['source_files']} files "
        f"under {sc['source_root']}")
    result = {"args": vars(args), "scenario": sc, "started": time.time()}
    if args.keep and os.path.exists(args.out):
        old = json.load(open(args.out))
        if old.get("scenario") != sc:
            raise SystemExit(f"--keep: {args.out} holds another scenario; run every part")
        for k in ("replay", "reprefill", "decoding", "peer"):
            if k in old and k not in parts:
                result[k] = old[k]
                log(f"kept the {k} part of {args.out}")

    def save():
        # After every part, so that a later part's failure loses nothing measured.
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    if "replay" in parts:
        log("part 1/4: the replay (bank capped, SSD tier on, SIGKILL mid-way), twice")
        result["replay"] = part_replay(args, sc, args.port)
        save()
    if "reprefill" in parts:
        log("part 2/4: the same replay with the session cache off (re-prefill)")
        result["reprefill"] = part_reprefill(args, sc, args.port + 1)
        save()
    if "decoding" in parts:
        log("part 3/4: decoding, plain vs proposers vs the default policy")
        result["decoding"] = part_decoding(args, sc, args.port + 2)
        save()
    if "peer" in parts and args.llama:
        log("part 4/4: llama.cpp's server, prompt cache on, the same replay")
        result["peer"] = part_peer(args, sc, args.port + 3)
    result["finished"] = time.time()
    save()
    log(f"results: {args.out}")


if __name__ == "__main__":
    sys.exit(main())
