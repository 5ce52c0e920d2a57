"""WideNet on DeepSpeed: one shared attention and one shared MoE layer across all blocks,
individual LayerNorms per block (Xue et al., "Go Wider Instead of Deeper", AAAI 2022)."""

__version__ = "0.1.0"
