"""Model configuration: one frozen, hashable dataclass, built from a Hugging Face config dict.

The config is passed as a static argument to jitted functions, so it must stay hashable and cheap to
compare. Dtypes are kept as strings ("float32", "bfloat16") so configs round-trip through JSON/YAML.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

SUPPORTED_ARCHITECTURES = ("qwen2", "llama", "qwen3")
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
SUPPORTED_DTYPES = ("float32", "bfloat16")
ATTENTION_IMPLS = ("auto", "reference", "pallas", "pallas_triton", "pallas_tpu")
ATTENTION_BACKWARDS = ("fused", "reference")  # pallas_kernels.flash_attention.BACKWARDS


class ConfigError(ValueError):
    """A model configuration is malformed or describes an architecture we do not support."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """A ``rope_scaling`` / ``rope_parameters`` entry of a Hugging Face config (``jf_jax.model.rope`` has the math)."""

    rope_type: str
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    """llama3 and yarn: the context the model was pretrained with."""
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    """yarn: the cos/sin scale; None derives it from the factor as transformers does."""
    truncate: bool = True

    def __post_init__(self):
        if self.rope_type not in ROPE_TYPES:
            raise ConfigError(f"rope_scaling type {self.rope_type!r} is not supported; supported: "
                              f"{', '.join(ROPE_TYPES)}")
        if not (isinstance(self.factor, (int, float)) and self.factor > 0):
            raise ConfigError(f"rope_scaling factor must be a positive number, got {self.factor!r}")
        if self.rope_type in ("llama3", "yarn") and not self.original_max_position_embeddings:
            raise ConfigError(f"rope_scaling type {self.rope_type!r} needs original_max_position_embeddings")
        if self.rope_type == "llama3":
            if self.low_freq_factor is None or self.high_freq_factor is None:
                raise ConfigError("rope_scaling type 'llama3' needs low_freq_factor and high_freq_factor")
            if not 0 < self.low_freq_factor < self.high_freq_factor:
                raise ConfigError(f"llama3 rope_scaling needs 0 < low_freq_factor < high_freq_factor, got "
                                  f"{self.low_freq_factor} and {self.high_freq_factor}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Dimensions and numerics of a Qwen2 / Qwen3 / Llama decoder-only transformer."""

    architecture: str
    """"qwen2" (q/k/v biases), "qwen3" (per-head q/k norms) or "llama"."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    """Grouped-query attention: each KV head serves num_heads // num_kv_heads query heads."""
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    attention_bias: bool
    tie_word_embeddings: bool
    dtype: str = "float32"
    """Compute dtype of matmuls and activations; norms, RoPE, softmax and logits stay float32."""
    param_dtype: str = "float32"
    attention_impl: str = "auto"
    """Attention among the tokens of a forward without a cache (training, full sequences): "reference" (plain
    JAX), "pallas" (the flash kernel in pallas_kernels with the device's backend: its Mosaic kernels on a TPU, its
    Triton kernel elsewhere, in interpret mode off the device), "pallas_tpu" / "pallas_triton" (that backend on
    any device; interpret mode on a CPU) or "auto" (the TPU kernel on a TPU, the Triton kernel on a GPU, the
    reference otherwise)."""
    attention_backward: str = "fused"
    """The gradient of the Pallas attention kernels: "fused" (their dq and dk/dv kernels, O(T) memory per head) or
    "reference" (autodiff of the plain-JAX reference, O(T x S) per head: the fallback should a fused backward fail
    to compile on some device). The "reference" attention_impl ignores it."""
    qk_norm: bool = False
    """Qwen3: RMSNorm over each query and key head (weights ``q_norm`` / ``k_norm`` [Dh]) before RoPE."""
    rope_scaling: RopeScaling | None = None
    """None: plain RoPE; else the scaling of ``jf_jax.model.rope``."""
    remat: bool = False
    """Training: recompute each layer's activations in the backward pass (the ``lax.scan`` body under
    ``jax.checkpoint``) instead of keeping every layer's. Measured on the 2-core CPU, SmolLM2-135M, 320 tokens:
    the bfloat16 stack's gradient 2.3 s -> 1.4 s (less memory traffic beats the recomputation); float32 unchanged."""

    def __post_init__(self):
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(
                f"unknown architecture {self.architecture!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"config field {name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not self.rope_theta > 0 or not self.rms_norm_eps > 0:
            raise ConfigError(f"rope_theta and rms_norm_eps must be positive, got "
                              f"{self.rope_theta!r} and {self.rms_norm_eps!r}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in SUPPORTED_DTYPES:
                raise ConfigError(f"{name} must be one of {SUPPORTED_DTYPES}, got {getattr(self, name)!r}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ConfigError(f"rope_scaling must be a RopeScaling, got {type(self.rope_scaling).__name__}")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ConfigError(f"attention_impl must be one of {ATTENTION_IMPLS}, got {self.attention_impl!r}")
        if self.attention_backward not in ATTENTION_BACKWARDS:
            raise ConfigError(f"attention_backward must be one of {ATTENTION_BACKWARDS}, got "
                              f"{self.attention_backward!r}")

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def weight_dtype(self):
        return jnp.dtype(self.param_dtype)

    @property
    def queries_per_kv_head(self) -> int:
        return self.num_heads // self.num_kv_heads

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown model config keys: {', '.join(unknown)}")
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.name not in data and f.default is dataclasses.MISSING)
        if missing:
            raise ConfigError(f"model config is missing keys: {', '.join(missing)}")
        data = dict(data)
        if isinstance(data.get("rope_scaling"), Mapping):
            data["rope_scaling"] = RopeScaling(**data["rope_scaling"])
        return cls(**data)


def _architecture_from_hf(hf: Mapping[str, Any]) -> str:
    model_type = str(hf.get("model_type", "")).lower()
    names = [str(n).lower() for n in hf.get("architectures") or ()]
    if "moe" in model_type or any("moe" in n for n in names) or hf.get("num_experts") or hf.get("num_local_experts"):
        raise ConfigError(f"mixture-of-experts models (model_type={hf.get('model_type')!r}) are not supported; "
                          f"supported: dense {', '.join(SUPPORTED_ARCHITECTURES)}")
    if model_type in SUPPORTED_ARCHITECTURES:
        return model_type
    for lowered in names:
        for arch in sorted(SUPPORTED_ARCHITECTURES, key=len, reverse=True):  # "qwen3..." before "qwen..."
            if lowered.startswith(arch) and lowered[len(arch):].startswith("forcausallm"):
                return arch
    raise ConfigError(
        f"unknown architecture (model_type={hf.get('model_type')!r}, architectures={hf.get('architectures')!r});"
        f" supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


_ROPE_FIELDS = {f.name for f in dataclasses.fields(RopeScaling)}
# Keys of a rope_parameters dict that are not scaling options (transformers 5 keeps rope_theta there).
_ROPE_IGNORED = {"rope_theta", "type", "rope_type"}


def rope_scaling_from_hf(hf: Mapping[str, Any]) -> RopeScaling | None:
    """The RoPE scaling of a HF config: ``rope_scaling`` (transformers 4) or ``rope_parameters`` (5); None for plain
    RoPE. Options we do not implement are refused by name, never ignored."""
    entry = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if not isinstance(entry, Mapping):
        raise ConfigError(f"rope_scaling must be a JSON object, got {entry!r}")
    kind = entry.get("rope_type") or entry.get("type") or "default"
    if entry.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ConfigError("partial rotary embeddings (partial_rotary_factor != 1) are not supported")
    if kind not in ROPE_TYPES:
        raise ConfigError(f"rope_scaling type {kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
    if kind == "default":
        return None
    options = {k: v for k, v in entry.items() if k not in _ROPE_IGNORED and k != "partial_rotary_factor"}
    unknown = sorted(set(options) - _ROPE_FIELDS)
    if unknown:
        raise ConfigError(f"rope_scaling option(s) {', '.join(unknown)} of type {kind!r} are not supported")
    if kind == "yarn" and "original_max_position_embeddings" not in options:
        options["original_max_position_embeddings"] = hf.get("max_position_embeddings")
    if options.get("factor") is None and kind == "yarn":  # transformers: the context ratio
        options["factor"] = hf["max_position_embeddings"] / options["original_max_position_embeddings"]
    if kind != "yarn" and options.get("attention_factor") not in (None, 1.0):
        raise ConfigError(f"rope_scaling attention_factor is only supported with type 'yarn', not {kind!r}")
    options = {k: v for k, v in options.items() if v is not None and not (k == "attention_factor" and kind != "yarn")}
    return RopeScaling(rope_type=kind, **options)


def _refuse_unsupported(hf: Mapping[str, Any], arch: str) -> None:
    if hf.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act {hf.get('hidden_act')!r} is not supported (only silu / SwiGLU)")
    if hf.get("use_sliding_window") or (arch == "llama" and hf.get("sliding_window")):
        raise ConfigError(f"sliding-window attention (use_sliding_window / sliding_window="
                          f"{hf.get('sliding_window')!r}) is not supported")
    if any(t != "full_attention" for t in hf.get("layer_types") or ()):
        raise ConfigError(f"layer_types other than full_attention ({sorted(set(hf['layer_types']))}) are not "
                          "supported")
    if hf.get("mlp_bias"):
        raise ConfigError(f"{arch} configs with mlp_bias=True are not supported")
    if arch == "qwen2" and hf.get("attention_bias") is False:
        raise ConfigError("qwen2 configs with attention_bias=False are not supported (Qwen2 always has q/k/v "
                          "biases)")


def from_hf_config(hf: Mapping[str, Any], **overrides) -> ModelConfig:
    """Builds a ModelConfig from a Hugging Face ``config.json`` dict (Qwen2, Qwen3 or Llama)."""
    if not isinstance(hf, Mapping):
        raise ConfigError(f"a Hugging Face config must be a JSON object, got {type(hf).__name__}")
    arch = _architecture_from_hf(hf)
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    missing = [k for k in required if k not in hf]
    if missing:
        raise ConfigError(f"Hugging Face config is missing keys: {', '.join(missing)}")
    _refuse_unsupported(hf, arch)
    num_heads = hf["num_attention_heads"]
    rope_params = hf.get("rope_parameters") or {}
    fields = dict(
        architecture=arch,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=hf.get("head_dim") or (hf["hidden_size"] // num_heads),
        rope_theta=float(hf.get("rope_theta", rope_params.get("rope_theta", 10000.0))),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=hf.get("max_position_embeddings", 32768),
        # Qwen2 always carries q/k/v biases; Llama and Qwen3 have an explicit flag (False for SmolLM2, Llama 2/3
        # and Qwen3).
        attention_bias=True if arch == "qwen2" else bool(hf.get("attention_bias", False)),
        # Qwen2Config, Qwen3Config and LlamaConfig default to untied embeddings.
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qk_norm=arch == "qwen3",
        rope_scaling=rope_scaling_from_hf(hf),
    )
    fields.update(overrides)
    return ModelConfig(**fields)


# Real configs used by tests and the roofline model (values from the published config.json files).
QWEN2P5_7B_HF_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584,
    "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": False,
    "hidden_act": "silu",
}
# More published shapes, for ``jf-jax plan`` (which compiles at a model's shapes without its weights): the values
# of each model's published config.json (Qwen/Qwen2.5-Coder-7B-Instruct, Qwen/Qwen3-8B, meta-llama/Llama-3.1-8B,
# Qwen/Qwen2.5-0.5B on the Hugging Face hub), the keys ``from_hf_config`` reads.
QWEN2P5_CODER_7B_HF_CONFIG = dict(QWEN2P5_7B_HF_CONFIG)  # the coder model has the base model's shapes
QWEN3_8B_HF_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096,
    "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 40960,
    "attention_bias": False, "tie_word_embeddings": False, "hidden_act": "silu",
}
LLAMA3P1_8B_HF_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "attention_bias": False,
    "mlp_bias": False, "tie_word_embeddings": False, "hidden_act": "silu",
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
QWEN2P5_0P5B_HF_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
    "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": True,
    "hidden_act": "silu",
}
PUBLISHED_SHAPES = {"qwen2.5-7b": QWEN2P5_7B_HF_CONFIG, "qwen2.5-coder-7b": QWEN2P5_CODER_7B_HF_CONFIG,
                    "qwen3-8b": QWEN3_8B_HF_CONFIG, "llama-3.1-8b": LLAMA3P1_8B_HF_CONFIG,
                    "qwen2.5-0.5b": QWEN2P5_0P5B_HF_CONFIG}
"""Model name -> its published Hugging Face config (shapes only: no weights ship with these)."""
