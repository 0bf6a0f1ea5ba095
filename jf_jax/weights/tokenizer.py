"""Tokenizer: a ``tokenizers.Tokenizer`` plus the special ids and chat template of its model.

Built either from a GGUF file's metadata (``tokenizer.ggml.*``: vocabulary, merges, token types, special
ids, chat template) or from a Hugging Face directory (``tokenizer.json``, ``tokenizer_config.json``,
``generation_config.json``). Neither torch nor transformers is imported: decoding loops and data
pipelines must not pay for them. Chat templates are rendered with jinja2 the way transformers does
(sandboxed, ``trim_blocks`` / ``lstrip_blocks``, ``loopcontrols``), so prompts match HF byte for byte.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from functools import lru_cache
from typing import Any, Mapping, Sequence

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers


class TokenizerError(ValueError):
    """A tokenizer description is missing, malformed, or of a kind we do not support."""


# Split regexes of the byte-level BPE pre-tokenizers llama.cpp names in ``tokenizer.ggml.pre``.
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _split_then_bytes(pattern: str):
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _pre_tokenizer(pre: str):
    """(normalizer, pre-tokenizer) matching how the vocabulary named ``pre`` was trained."""
    if pre == "smollm":  # as in SmolLM2's tokenizer.json: every digit is its own word
        return None, pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                              pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre in ("qwen2", "deepseek-r1-qwen"):  # Qwen2's tokenizer.json also NFC-normalizes
        return normalizers.NFC(), _split_then_bytes(_QWEN2_SPLIT)
    if pre in ("llama-bpe", "llama3", "llama-v3"):
        return None, _split_then_bytes(_LLAMA3_SPLIT)
    if pre in ("default", "gpt-2", "gpt2"):
        return None, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raise TokenizerError(f"unsupported GGUF pre-tokenizer {pre!r}; supported: smollm, qwen2, "
                         "deepseek-r1-qwen, llama-bpe, llama3, default, gpt2")


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the alphabet byte-level vocabularies are spelled in)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _gguf_backend(meta: Mapping[str, Any], source: str) -> tokenizers.Tokenizer:
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise TokenizerError(f"{source}: tokenizer.ggml.model is {kind!r}; only byte-level BPE ('gpt2') "
                             "vocabularies are supported")
    tokens = list(meta.get("tokenizer.ggml.tokens") or ())
    merges = list(meta.get("tokenizer.ggml.merges") or ())
    if not tokens or not merges:
        raise TokenizerError(f"{source}: GGUF metadata lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")
    table = _byte_alphabet()
    alphabet = set(table.values())
    # A token written with characters outside the byte alphabet is re-spelled through it, so that it is
    # reachable by the byte-level pre-tokenizer (llama.cpp stores a few tokens that way).
    spelled = [t if set(t) <= alphabet else "".join(table[b] for b in t.encode("utf-8")) for t in tokens]
    vocab: dict[str, int] = {}
    for index, token in enumerate(spelled):
        vocab.setdefault(token, index)  # first id wins on duplicates, as in llama.cpp's token_to_id
    pairs = []
    for merge in merges:
        parts = merge.split(" ")
        if len(parts) != 2:
            raise TokenizerError(f"{source}: malformed merge {merge!r} in tokenizer.ggml.merges")
        pairs.append((parts[0], parts[1]))
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    normalizer, pre = _pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "default")))
    if normalizer is not None:
        backend.normalizer = normalizer
    backend.pre_tokenizer = pre
    backend.decoder = decoders.ByteLevel()
    # Control tokens (type 3, e.g. <|im_start|>) must encode whole and are dropped by skip_special_tokens;
    # user-defined ones (type 4) also encode whole but are ordinary text when decoding.
    types = list(meta.get("tokenizer.ggml.token_type") or ())
    control = [AddedToken(t, special=True, normalized=False) for t, k in zip(spelled, types) if k == 3]
    user = [AddedToken(t, special=False, normalized=False) for t, k in zip(spelled, types) if k == 4]
    backend.add_special_tokens(control)
    backend.add_tokens(user)
    if backend.get_vocab_size(with_added_tokens=True) != len(vocab):
        raise TokenizerError(f"{source}: registering special tokens grew the vocabulary past {len(vocab)}")
    return backend


def _token_content(value) -> str | None:
    """tokenizer_config.json spells special tokens as a string or as an AddedToken dict."""
    if isinstance(value, Mapping):
        return value.get("content")
    return value if isinstance(value, str) else None


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{path}: cannot read JSON: {e}") from e


@lru_cache(maxsize=16)
def _compile_template(template: str):
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TokenizerError(f"chat template error: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise TokenizerError(f"chat template does not parse: {e}") from e


@dataclasses.dataclass(frozen=True, eq=False)
class Tokenizer:
    """Text <-> token ids for one model, with its special ids and chat template."""

    backend: tokenizers.Tokenizer
    bos_id: int | None
    eos_ids: tuple[int, ...]
    """Every id that ends generation (e.g. <|im_end|> and <|endoftext|> for chat models)."""
    pad_id: int | None
    add_bos: bool
    """Whether ``encode`` prepends ``bos_id`` (what the model's own tokenizer does)."""
    chat_template: str | None = None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(int(token_id))

    def encode(self, text: str) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if self.add_bos and self.bos_id is not None else ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, prompt: str | list[dict], add_generation_prompt: bool = True) -> str:
        """The model's chat template rendered on ``prompt`` (a user message, or a list of messages)."""
        if self.chat_template is None:
            raise TokenizerError("this tokenizer has no chat template")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        name = lambda i: self.id_to_token(i) if i is not None else None  # noqa: E731
        return _compile_template(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=name(self.bos_id) or "", eos_token=name(self.eos_ids[0]) if self.eos_ids else "",
            pad_token=name(self.pad_id))

    # --- construction -------------------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], source: str = "GGUF file") -> "Tokenizer":
        """From a GGUF's metadata as plain Python values (see ``jf_jax.weights.gguf.read_metadata``)."""
        backend = _gguf_backend(meta, source)
        get_id = lambda key: None if meta.get(key) is None else int(meta[key])  # noqa: E731
        template = meta.get("tokenizer.chat_template")
        eos = _ids(get_id("tokenizer.ggml.eos_token_id")) + _ids(get_id("tokenizer.ggml.eot_token_id"))
        # A GGUF has no generation_config.json; a chat model stops at its turn-end token, which its
        # template writes after each message.
        end_turn = backend.token_to_id("<|im_end|>")
        if template and end_turn is not None and "<|im_end|>" in template:
            eos.append(end_turn)
        return cls(backend=backend, bos_id=get_id("tokenizer.ggml.bos_token_id"),
                   eos_ids=tuple(dict.fromkeys(eos)), pad_id=get_id("tokenizer.ggml.padding_token_id"),
                   add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)), chat_template=template)

    @classmethod
    def from_hf_dir(cls, path: str) -> "Tokenizer":
        """From a Hugging Face model directory holding tokenizer.json (+ tokenizer_config.json etc.)."""
        file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(file):
            raise TokenizerError(f"{path}: no tokenizer.json (only fast-tokenizer directories are supported)")
        try:
            backend = tokenizers.Tokenizer.from_file(file)
        except Exception as e:  # the Rust parser raises a bare Exception
            raise TokenizerError(f"{file}: cannot parse: {e}") from e
        tok_cfg = _read_json(os.path.join(path, "tokenizer_config.json"))
        gen_cfg = _read_json(os.path.join(path, "generation_config.json"))
        model_cfg = _read_json(os.path.join(path, "config.json"))
        by_name = lambda key: backend.token_to_id(_token_content(tok_cfg.get(key)) or "")  # noqa: E731
        bos = by_name("bos_token")
        if bos is None:
            bos = next(iter(_ids(gen_cfg.get("bos_token_id")) or _ids(model_cfg.get("bos_token_id"))), None)
        eos = _ids(gen_cfg.get("eos_token_id")) + _ids(by_name("eos_token")) + _ids(model_cfg.get("eos_token_id"))
        pad = by_name("pad_token")
        if pad is None:
            pad = next(iter(_ids(gen_cfg.get("pad_token_id"))), None)
        if "add_bos_token" in tok_cfg:
            add_bos = bool(tok_cfg["add_bos_token"])
        else:  # e.g. Llama 3: the post-processor in tokenizer.json is what adds BOS
            add_bos = bos is not None and backend.encode("", add_special_tokens=True).ids[:1] == [bos]
        template = tok_cfg.get("chat_template")
        if template is None and os.path.isfile(os.path.join(path, "chat_template.jinja")):
            with open(os.path.join(path, "chat_template.jinja"), encoding="utf-8") as f:
                template = f.read()
        if isinstance(template, list):  # named templates: use the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        return cls(backend=backend, bos_id=bos, eos_ids=tuple(dict.fromkeys(eos)), pad_id=pad,
                   add_bos=add_bos, chat_template=template)

    # --- serialization (the converted-weights cache stores tokenizers this way) ----------------------

    def save(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        self.backend.save(os.path.join(path, "tokenizer.json"))
        meta = dict(bos_id=self.bos_id, eos_ids=list(self.eos_ids), pad_id=self.pad_id, add_bos=self.add_bos,
                    chat_template=self.chat_template)
        with open(os.path.join(path, "jf_jax_tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, ensure_ascii=False)

    @classmethod
    def load_saved(cls, path: str) -> "Tokenizer":
        meta = _read_json(os.path.join(path, "jf_jax_tokenizer.json"))
        if not meta:
            raise TokenizerError(f"{path}: no jf_jax_tokenizer.json (not written by Tokenizer.save)")
        backend = tokenizers.Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        return cls(backend=backend, bos_id=meta["bos_id"], eos_ids=tuple(meta["eos_ids"]), pad_id=meta["pad_id"],
                   add_bos=meta["add_bos"], chat_template=meta["chat_template"])
