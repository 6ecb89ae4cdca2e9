"""What candidate source may name: the allowlist of the static policy, as data, in one place.

The policy (:mod:`kernelforge.policy.checker`) accepts a name, attribute or call only when it is
listed here; everything else is refused with its name and line. docs/evaluation.md explains each
list. Extending the allowlist is a review decision: every entry must be unable to compute the
block's result outside a Triton kernel, reach the interpreter's internals, touch the harness, the
file system, the network or other processes, or change how the candidate is timed.
"""

from __future__ import annotations

#: ``import X`` / ``from X import ...`` sources a candidate may use, and the module path each binds.
IMPORTS = frozenset({
    "math", "torch", "triton", "triton.language", "triton.language.math", "triton.language.extra",
    "triton.language.extra.libdevice", "triton.tools", "triton.tools.tensor_descriptor",
})

#: The only ``from __future__`` feature (a compiler directive, not a name the code can use).
FUTURE_FEATURES = frozenset({"annotations"})

#: Module -> the attributes a candidate may use of it. A name that is itself an importable module
#: (``triton.language``) continues the chain; any other name yields a value (see VALUE_ATTRIBUTES).
#: ``"*"``: every public function of the module (libdevice: device math only).
MODULE_ATTRIBUTES: dict[str, frozenset[str]] = {
    "math": frozenset({
        "ceil", "floor", "sqrt", "isqrt", "log", "log2", "log10", "exp", "exp2", "pow", "inf", "nan", "pi", "e",
        "prod", "gcd", "lcm", "isfinite", "isinf", "isnan", "copysign", "fabs", "trunc", "comb",
    }),
    "torch": frozenset({
        # dtypes and types (for annotations, isinstance and allocation)
        "dtype", "device", "Size", "Tensor", "finfo", "iinfo",
        "float16", "half", "bfloat16", "float32", "float", "float64", "double",
        "int8", "int16", "int32", "int", "int64", "long", "uint8", "uint16", "uint32", "uint64", "bool",
        "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
        # allocation
        "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
        "full_like", "arange", "tensor",
        # views and data movement
        "reshape", "flatten", "transpose", "permute", "narrow", "split", "chunk", "unbind", "squeeze",
        "unsqueeze", "as_strided", "cat", "stack",
        # integer index operations (MoE routing on the host; floating-point use is refused at run time)
        "argsort", "sort", "cumsum", "bincount", "scatter_add", "searchsorted", "gather",
        # no-op context managers
        "no_grad", "inference_mode",
    }),
    "triton": frozenset({"jit", "cdiv", "next_power_of_2", "heuristics", "Config", "constexpr", "set_allocator"}),
    "triton.tools": frozenset(),
    # Host-side TMA descriptors (Hopper): TensorDescriptor.from_tensor(x, block_shape).
    "triton.tools.tensor_descriptor": frozenset({"TensorDescriptor"}),
    "triton.language": frozenset({
        "PropagateNan", "abs", "advance", "arange", "argmax", "argmin", "associative_scan", "assume",
        "atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or", "atomic_xchg",
        "atomic_xor", "bfloat16", "block_type", "broadcast", "broadcast_to", "cast", "cat", "cdiv", "ceil",
        "clamp", "constexpr", "cos", "cumprod", "cumsum", "debug_barrier", "device_assert", "div_rn", "dot",
        "dot_scaled", "dtype", "erf", "exp", "exp2", "expand_dims", "fdiv", "flip", "float16", "float32",
        "float64", "float8e4b15", "float8e4b8", "float8e4nv", "float8e5", "float8e5b16", "floor", "fma",
        "full", "gather", "histogram", "int1", "int16", "int32", "int64", "int8", "interleave", "join",
        "load", "load_tensor_descriptor", "log", "log2", "make_tensor_descriptor", "max", "max_constancy",
        "max_contiguous", "maximum", "min", "minimum", "multiple_of", "num_programs", "permute",
        "pointer_type", "program_id", "rand", "randint", "randn", "range", "ravel", "reduce", "reshape",
        "rsqrt", "sigmoid", "sin", "softmax", "sort", "split", "sqrt", "sqrt_rn", "squeeze", "static_assert",
        "static_range", "store", "store_tensor_descriptor", "sum", "swizzle2d", "tensor", "topk", "trans",
        "uint16", "uint32", "uint64", "uint8", "umulhi", "unsqueeze", "view", "where", "xor_sum", "zeros",
        "zeros_like",
    }),
    "triton.language.math": frozenset({
        "abs", "ceil", "cos", "div_rn", "erf", "exp", "exp2", "fdiv", "floor", "fma", "log", "log2", "rsqrt",
        "sin", "sqrt", "sqrt_rn", "umulhi",
    }),
    "triton.language.extra": frozenset(),
    "triton.language.extra.libdevice": frozenset({"*"}),
}

#: Attributes of values in host code (tensors, dtypes, dicts of heuristics arguments, tuples):
#: shapes, strides, dtypes, allocation, views and copies. Nothing that computes on floating-point
#: data or turns tensor data into Python values (``.item``, ``.tolist``, ``.numpy``, ``.cpu``).
HOST_VALUE_ATTRIBUTES = frozenset({
    # metadata
    "shape", "dtype", "device", "ndim", "stride", "size", "numel", "dim", "is_contiguous", "element_size",
    "itemsize", "nbytes", "data_ptr", "is_cuda", "is_floating_point", "type", "index", "storage_offset",
    # views
    "view", "reshape", "flatten", "transpose", "permute", "unsqueeze", "squeeze", "expand", "narrow",
    "split", "chunk", "unbind", "contiguous", "T", "mT", "t", "view_as", "expand_as", "unflatten",
    # allocation and copies
    "to", "new_empty", "new_zeros", "new_ones", "new_full", "zero_", "fill_", "copy_", "clone",
    # integer index operations of host-side routing (floating-point use is refused at run time)
    "scatter_add_", "clamp_", "index_fill_", "masked_fill_",
    # torch.finfo / iinfo fields (a tensor's .max()/.min() on floats is refused at run time)
    "max", "min", "eps", "tiny", "bits",
    # TMA descriptors
    "from_tensor",
    # dicts (heuristics' args), lists and tuples
    "items", "keys", "values", "get", "append", "extend",
})

#: Attributes of values inside ``@triton.jit`` functions: Triton tensor methods and metadata.
JIT_VALUE_ATTRIBUTES = frozenset({
    "T", "abs", "argmax", "argmin", "associative_scan", "atomic_add", "atomic_and", "atomic_cas",
    "atomic_max", "atomic_min", "atomic_or", "atomic_xchg", "atomic_xor", "broadcast_to", "cast", "cdiv",
    "ceil", "cos", "cumprod", "cumsum", "erf", "exp", "exp2", "expand_dims", "flip", "floor", "gather",
    "histogram", "log", "log2", "logical_and", "logical_or", "max", "min", "permute", "ravel", "reduce",
    "reshape", "rsqrt", "sigmoid", "sin", "softmax", "sort", "split", "sqrt", "sqrt_rn", "sum", "to",
    "trans", "view", "xor_sum", "load", "store", "advance",
    "dtype", "shape", "numel", "element_ty", "type", "value", "primitive_bitwidth", "is_floating",
    "is_int_signed", "is_ptr",
})

#: Python builtins host code may call or name.
HOST_BUILTINS = frozenset({
    "range", "len", "min", "max", "abs", "int", "float", "bool", "tuple", "list", "dict", "enumerate",
    "zip", "isinstance", "round", "sum", "any", "all", "sorted", "reversed", "str", "divmod", "pow",
    "ValueError", "TypeError", "RuntimeError", "NotImplementedError", "AssertionError", "KeyError",
    "IndexError",
})

#: Python builtins Triton's code generator understands inside ``@triton.jit`` functions.
JIT_BUILTINS = frozenset({"range", "min", "max", "len", "int", "float", "abs", "isinstance", "tuple"})

#: Exceptions a candidate may catch (a narrow ``except`` for a view that may fail); broad ones
#: (bare, ``Exception``, ``BaseException``) would turn any failure into a silent fallback.
CATCHABLE = frozenset({"ValueError", "TypeError", "RuntimeError", "IndexError", "KeyError", "AssertionError"})

#: Decorators that mark device code (``@triton.jit``, ``@triton.jit(...)``) and the one wrapper
#: allowed around it (``@triton.heuristics({...})``).
JIT_DECORATORS = frozenset({"triton.jit"})
WRAPPER_DECORATORS = frozenset({"triton.heuristics"})

#: ``with`` statements host code may open.
CONTEXT_MANAGERS = frozenset({"torch.no_grad", "torch.inference_mode"})
