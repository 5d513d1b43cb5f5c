#!/usr/bin/env python3
"""Reference tokenizers for a GGUF model.

* LlamaCppTokenizer: the authoritative one -- llama.cpp's own tokenizer via
  llama-cpp-python (Llama(model_path, vocab_only=True)).  Used for every id in
  the fixtures.
* HFFromGGUFTokenizer: a second, independent implementation built with the
  Hugging Face `tokenizers` package from the GGUF's vocab + merges, with the
  pre-tokenizer that llama.cpp's "smollm" pre-type corresponds to
  (Digits(individual) then GPT-2 ByteLevel regex).  Only used as a cross-check;
  disagreements are reported by make_fixtures.py.
* render_chat: renders a chat template with python jinja2 configured like
  transformers' apply_chat_template (trim_blocks, lstrip_blocks, sandboxed,
  HF-style tojson, raise_exception).
"""
from __future__ import annotations

import json

from gguf import GGUFReader


def gguf_metadata(path, keys):
    r = GGUFReader(path)
    return {k: (r.fields[k].contents() if k in r.fields else None) for k in keys}


class LlamaCppTokenizer:
    def __init__(self, gguf_path):
        from llama_cpp import Llama
        self.llm = Llama(model_path=gguf_path, vocab_only=True, verbose=False)
        import llama_cpp
        self.version = llama_cpp.__version__

    def encode(self, text: str, add_bos=False, special=True):
        if text == "":
            return []
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special))

    def decode_bytes(self, ids, special=True) -> bytes:
        return self.llm.detokenize(ids, special=special)

    def decode(self, ids, special=True) -> str:
        return self.decode_bytes(ids, special).decode("utf-8", errors="replace")


class HFFromGGUFTokenizer:
    def __init__(self, gguf_path):
        from tokenizers import Tokenizer, AddedToken, decoders, pre_tokenizers
        from tokenizers.models import BPE
        r = GGUFReader(gguf_path)
        toks = r.fields["tokenizer.ggml.tokens"].contents()
        types = r.fields["tokenizer.ggml.token_type"].contents()
        merges = [tuple(m.split(" ", 1)) for m in r.fields["tokenizer.ggml.merges"].contents()]
        pre = r.fields["tokenizer.ggml.pre"].contents()
        assert pre == "smollm", pre
        vocab = {t: i for i, t in enumerate(toks)}
        tk = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
        tk.decoder = decoders.ByteLevel()
        specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(toks, types) if ty == 3]
        tk.add_special_tokens(specials)
        self.tk = tk

    def encode(self, text):
        return self.tk.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        return self.tk.decode(ids, skip_special_tokens=False)


def _hf_tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # same as transformers.utils.chat_template_utils' tojson filter
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def render_chat(template: str, messages, add_generation_prompt=True, **extra) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.exceptions import TemplateError

    def raise_exception(msg):
        raise TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _hf_tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt, **extra)
