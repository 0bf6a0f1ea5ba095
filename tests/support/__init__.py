"""Importable helpers of the test suite: small models (random, predictable, Hugging Face twins, GGUF files)."""
