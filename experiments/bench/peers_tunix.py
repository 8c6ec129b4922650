"""The tunix side of ``experiments.bench.peers``, run by that benchmark in tunix's own venv
(``make peers``: ``.venv-peers``, since tunix pins ``safetensors<0.8``). Imports tunix, JAX and
transformers only, never hindsight.

    .venv-peers/bin/python experiments/bench/peers_tunix.py --folder HF_FOLDER --cache-size 96 \
        [--dtype bfloat16]

It builds tunix's Qwen2 model from the HF folder (``tunix.models.qwen2.params``) and its
``Sampler``, prints ``{"ready": ...}``, then answers requests, one JSON object per stdin line
(``{"prompts": [str, ...], "new": int, "max_prompt_length": int, "seed": int}``), with one JSON
line each: ``{"seconds": wall time of the sampler call, "generated": tokens it returned,
"prompt_tokens": the first prompt's length as tunix tokenized it (BOS included)}``.
Sampling is tunix's pure ``jax.random.categorical`` path (temperature 1, top-p 1, no top-k) and
``eos_tokens=[-1]`` (an id that never occurs), so every row runs the full ``new`` steps.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--folder", required=True)
    p.add_argument("--cache-size", type=int, required=True)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = p.parse_args()

    import dataclasses

    import jax.numpy as jnp

    from transformers import AutoTokenizer
    from tunix.generate import sampler as sampler_lib
    from tunix.models.qwen2 import model as qwen2_model
    from tunix.models.qwen2 import params as qwen2_params

    with open(f"{args.folder}/config.json", encoding="utf-8") as f:
        hf = json.load(f)
    cfg = dataclasses.replace(
        qwen2_model.ModelConfig.qwen2p5_0p5b(), num_layers=hf["num_hidden_layers"],
        vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"], hidden_dim=hf["intermediate_size"],
        num_heads=hf["num_attention_heads"], num_kv_heads=hf["num_key_value_heads"],
        head_dim=hf["hidden_size"] // hf["num_attention_heads"], norm_eps=hf["rms_norm_eps"],
        rope_theta=int(hf["rope_theta"] if "rope_theta" in hf else hf["rope_parameters"]["rope_theta"]),
        use_tied_embedding=bool(hf.get("tie_word_embeddings", False)))
    t = time.perf_counter()
    model = qwen2_params.create_model_from_safe_tensors(args.folder, cfg,
                                                        dtype=jnp.dtype(args.dtype))
    tok = AutoTokenizer.from_pretrained(args.folder)
    sampler = sampler_lib.Sampler(model, tok, sampler_lib.CacheConfig(
        cache_size=args.cache_size, num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim))
    print(json.dumps({"ready": True, "load_s": time.perf_counter() - t}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        t = time.perf_counter()
        out = sampler(req["prompts"], max_generation_steps=req["new"],
                      max_prompt_length=req["max_prompt_length"], temperature=1.0, top_p=1.0,
                      top_k=None, eos_tokens=[-1], seed=req["seed"])
        seconds = time.perf_counter() - t
        generated = sum(len(tokens) for tokens in out.tokens)
        prompt_tokens = len(sampler.tokenize(req["prompts"][0]))
        print(json.dumps({"seconds": seconds, "generated": generated,
                          "prompt_tokens": prompt_tokens}), flush=True)


if __name__ == "__main__":
    main()
