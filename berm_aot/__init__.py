"""Ahead-of-time translation of RV64IMAC harness images: ELF reading, decoding, analysis, C emission, compiling
and the content-addressed code cache. Knows nothing of capabilities, agents or the protocol."""
