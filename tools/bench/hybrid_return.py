#!/usr/bin/env python3
# usage: hybrid_return.py SERVER_BINARY MODEL_DIR WORK_DIR  (openai client; see docs/bench/hybrid.md)
# Through the server with the openai client: a 6K-token agent conversation on the synthetic
# hybrid model returns (a) at once from RAM, (b) after a restart from the SSD tier, vs the
# same turn cold (cache off).  Prints TTFT per case.
import json, os, subprocess, sys, time, signal
from openai import OpenAI

BIN, MODEL, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
SYSTEM = " ".join(f"Rule {i}: when tool call {i} fails, retry it once with the file it names and report the diff." for i in range(260))

def start(name, extra):
    out = open(f"{WORK}/{name}.out", "w")
    p = subprocess.Popen([BIN, "--model", MODEL, "--port", "0", "--context-window", "8192",
                          "--ssd-session-cache-dir", f"{WORK}/ssd", "--ssd-session-cache-free-disk-floor", "0",
                          "--session-bank-max-entries", "1", "--request-log-jsonl", f"{WORK}/{name}.jsonl"] + extra,
                         stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "MTPLX_HOME": f"{WORK}/home"})
    for _ in range(3000):
        t = open(f"{WORK}/{name}.out").read()
        if "on http://" in t:
            addr = t.split("on http://")[1].split()[0]
            return p, OpenAI(base_url=f"http://{addr}/v1", api_key="x")
        time.sleep(0.02)
    raise SystemExit("no start: " + open(f"{WORK}/{name}.out").read())

def turn(c, msgs, session, n):
    t0 = time.time(); first = None; text = ""
    s = c.chat.completions.create(model="tiny-qwen3-next", messages=msgs, max_tokens=n, temperature=0,
                                  stream=True, extra_headers={"x-session-id": session})
    for ch in s:
        if ch.choices and ch.choices[0].delta.content:
            first = first or time.time(); text += ch.choices[0].delta.content
    return (first or time.time()) - t0, text

q1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Tool call 12 failed. What now?"}]
p, c = start("one", [])
ttft1, a1 = turn(c, q1, "agent", 16)
q2 = q1 + [{"role": "assistant", "content": a1}, {"role": "user", "content": "It failed again."}]
ram, ans_ram = turn(c, q2, "agent", 16)
turn(c, [{"role": "user", "content": "hello"}], "other", 4)  # evicts "agent" to the SSD
time.sleep(4)
p.send_signal(signal.SIGTERM); p.wait()
p, c = start("two", [])
ssd, ans_ssd = turn(c, q2, "agent", 16)
p.send_signal(signal.SIGTERM); p.wait()
p, c = start("cold", ["--ssd-session-cache", "off"])
cold, ans_cold = turn(c, q2, "agent", 16)
p.send_signal(signal.SIGTERM); p.wait()
logs = [json.loads(l) for n in ("one", "two") for l in open(f"{WORK}/{n}.jsonl")]
print(json.dumps({"turn1_ttft_s": ttft1, "ram_ttft_s": ram, "ssd_after_restart_ttft_s": ssd, "cold_ttft_s": cold,
                  "same_answer": ans_ram == ans_ssd == ans_cold,
                  "log": [(l.get("prompt_tokens"), l.get("cached_tokens"), l.get("session_restore_mode")) for l in logs]}, indent=1))
