"""Golden logits of a Qwen3-Next folder from transformers itself (`Qwen3NextForCausalLM`).

Run where transformers and torch are installed (the GPU machine has both; the CPU is
enough). The folder comes from `cargo xtask make-hybrid --tiny`; the ids are the same
deterministic sequence `crates/mtplx-model/tests/hybrid_transformers.rs` uses. Writes the
fixture `tests/fixtures/hybrid/transformers_tiny.json`: the ids, transformers' version and
its float32 logits for every position.

    python3 tools/reference/transformers_qwen3_next.py FOLDER OUT.json
"""

import json
import sys

import torch
import transformers
from transformers import Qwen3NextForCausalLM


def ids(n, vocab, seed):
    """xorshift64, as the Rust test draws them."""
    out = []
    mask = (1 << 64) - 1
    for _ in range(n):
        seed ^= (seed << 13) & mask
        seed ^= seed >> 7
        seed ^= (seed << 17) & mask
        out.append(seed % vocab)
    return out


def main():
    folder, out_path = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    vocab = model.config.vocab_size
    seq = ids(96, vocab, 0x2545F4914F6CDD1D)
    with torch.no_grad():
        # One pass over the whole sequence (the chunked delta rule), then the same sequence
        # token by token (the recurrent one), to see transformers' own two paths agree.
        whole = model(torch.tensor([seq])).logits[0]
        cache = None
        steps = []
        for t in seq:
            o = model(torch.tensor([[t]]), past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            steps.append(o.logits[0, -1])
        steps = torch.stack(steps)
    scale = whole.abs().max().item()
    json.dump(
        {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "ids": seq,
            "vocab": vocab,
            "paths_relative_difference": (whole - steps).abs().max().item() / scale,
            "logits": [[float(v) for v in row] for row in whole.tolist()],
        },
        open(out_path, "w"),
    )
    print(
        f"transformers {transformers.__version__}: {len(seq)} positions, "
        f"whole vs step-by-step relative difference "
        f"{(whole - steps).abs().max().item() / scale:.3e}"
    )


if __name__ == "__main__":
    main()
