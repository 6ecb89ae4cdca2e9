"""The trusted judge: is a candidate's output right, on every shape and every call?

- :mod:`.verify`: the verdict of one shape: a candidate against its block's reference, with the
  defenses (poisoned outputs, fresh inputs, repeated calls, held-out shapes).
- :mod:`.compare`: the tolerance check of one output against its reference.
- :mod:`.contract`: the block contract as the harness reads it (which tensors a candidate writes).
- :mod:`.guard`: one call of a candidate and the checks made around it by the process that runs it.
- :mod:`.fingerprint`: byte-level views of tensors: raw bytes, bitwise equality, poison.
- :mod:`.held_out`: which held-out shapes a candidate is verified on, drawn by the trusted side.
- :mod:`.harness`: has a candidate replaced a function the verdicts or timings rely on?
"""

__all__ = ["verify", "compare", "contract", "guard", "fingerprint", "held_out", "harness"]
