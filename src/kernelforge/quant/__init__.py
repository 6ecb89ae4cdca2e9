"""Quantised weight formats of the blocks: packing, exact dequantisation, byte counts
(:mod:`.base` the contract; :mod:`.fp8`, :mod:`.int4`, :mod:`.mxfp4` the formats)."""

__all__ = ["base", "fp8", "int4", "mxfp4"]
