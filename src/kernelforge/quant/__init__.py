"""Quantised weight formats: packing, exact dequantisation, byte counts."""
