#!/usr/bin/env python3
"""Cross-check ref_model.py against llama.cpp itself.

llama.cpp's Q4_1 matmul quantizes the *activations* to Q8_1 before the dot
product, so its logits differ from an exact (dequantize-then-matmul) forward by
O(0.5-1.5) on this model (and it keeps the KV cache in F16 by default).  To separate that from real bugs, this script also has
llama.cpp dequantize the whole model to an all-F32 GGUF (llama_model_quantize
with ftype ALL_F32) and runs llama.cpp on that: then llama.cpp does plain f32
matmuls on exactly the same weight values as the reference, and the logits must
agree to ~1e-4.

    python tools/reference/crosscheck_llamacpp.py [--prompts N]
Prints a JSON report.  make_fixtures.py golden records the same two checks per
case (llama_cpp_cross_check); this script is the quick stand-alone version.
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as MF  # noqa: E402
import ref_model as R  # noqa: E402
import ref_tokenizer as RT  # noqa: E402


def llama_logits(llm, ids):
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8, help="how many golden prompts (in order) to check")
    ap.add_argument("--f32-gguf", default="/tmp/mtplx-smollm2-f32.gguf")
    a = ap.parse_args()
    from llama_cpp import Llama
    MF.make_f32_gguf(MF.GGUF_PATH, a.f32_gguf)
    tok = RT.LlamaCppTokenizer(MF.GGUF_PATH)
    tmpl = RT.gguf_metadata(MF.GGUF_PATH, ["tokenizer.chat_template"])["tokenizer.chat_template"]
    ref = R.load_gguf(MF.GGUF_PATH)
    kw = dict(n_ctx=2400, n_batch=512, logits_all=True, verbose=False, n_threads=2)
    q = Llama(model_path=MF.GGUF_PATH, **kw)
    # F32 KV cache too (llama.cpp's default KV cache is F16, worth ~1e-2 on the logits)
    f = Llama(model_path=a.f32_gguf, type_k=0, type_v=0, **kw)
    rows = []
    for p in MF.golden_prompts()[: a.prompts]:
        prompt = RT.render_chat(tmpl, p["messages"]) if p["kind"] == "chat" else p["text"]
        ids = tok.encode(prompt)
        lr = ref.forward(ids)
        lq = llama_logits(q, ids)
        lf = llama_logits(f, ids)
        rows.append({"name": p["name"], "n_prompt_tokens": len(ids), "ref_argmax": int(lr.argmax()),
                     "llama_cpp_q4_1": {"max_abs_diff": float(f"{np.abs(lq - lr).max():.3g}"), "argmax": int(lq.argmax())},
                     "llama_cpp_f32": {"max_abs_diff": float(f"{np.abs(lf - lr).max():.3g}"), "argmax": int(lf.argmax())}})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
