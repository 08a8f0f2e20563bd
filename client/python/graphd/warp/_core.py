"""A Warp function's signature, and its program for one set of shapes and
static values: recorded twice (the two runs must agree), then assembled."""

import threading

from ._build import assemble
from ._record import Recorder, arg_buffer, release_args
from ._steps import Recording
from ._support import Refused, warp_modules


class ArgInfo:
    """One argument of a Warp function or kernel, as jax_callable reads it:
    an array (warp dtype, warp ndim, the dtype's inner shape) or a scalar
    (a static value)."""

    def __init__(self, name, type_):
        wp, _, types_mod = warp_modules()
        self.name, self.type = name, type_
        self.is_array = types_mod.matches_array_class(type_, wp.array)
        if self.is_array:
            dt = type_.dtype
            if hasattr(dt, "_wp_scalar_type_"):
                self.dtype_shape = tuple(dt._shape_)
                self.scalar = dt._wp_scalar_type_
            elif dt in types_mod.value_types:
                self.dtype_shape = ()
                self.scalar = dt
            else:
                raise TypeError(f"Invalid data type for array argument '{name}', expected scalar, vector, or matrix")
            self.dtype = dt
            self.ndim = type_.ndim
            self.outer_ndim = self.ndim + len(self.dtype_shape)
            self.itemsize = types_mod.type_size_in_bytes(dt)
        elif type_ in types_mod.value_types:
            self.dtype_shape, self.ndim, self.outer_ndim = (), 0, 0
            self.scalar = types_mod.type_to_warp(type_) if hasattr(types_mod, "type_to_warp") else type_
        else:
            raise TypeError(f"Invalid type for argument '{name}', expected array or scalar, got {type_}")
        self.in_out = False
        self.role = "input"

    def jax_dtype(self):
        """The JAX dtype of the array's scalar, as Warp's jax_callable
        checks and makes it (bfloat16 is JAX's bfloat16, not the uint16
        Warp's numpy table stores it as)."""
        wp, _, _ = warp_modules()
        import numpy as np
        return np.dtype(wp.dtype_to_jax(self.scalar))

    def warp_shape(self, outer_shape):
        """The Warp array shape of an outer (JAX) shape: the dtype's inner
        dims dropped, leading batch dims folded into the first."""
        shape = tuple(outer_shape[:len(outer_shape) - len(self.dtype_shape)])
        while len(shape) > self.ndim:
            shape = (shape[0] * shape[1],) + shape[2:]
        return shape


class FuncSpec:
    """Inputs (in-out included) first, then pure outputs, as Warp's
    jax_callable splits a function's arguments."""

    def __init__(self, name, args, num_outputs, in_out_argnames=None, stage_in_argnames=None,
                 stage_out_argnames=None):
        self.name = name
        self.args = args
        names = list(in_out_argnames or [])
        in_out = set(names)
        if len(names) != len(in_out):
            raise ValueError("in_out_argnames must not contain duplicate names")
        n = len(args)
        if num_outputs < 1:
            raise ValueError("At least one output is required")
        if num_outputs > n:
            raise ValueError("Number of outputs cannot be greater than the number of kernel arguments")
        if num_outputs < len(in_out):
            raise ValueError("Number of outputs cannot be smaller than the number of in_out_argnames")
        self.num_outputs = num_outputs
        self.num_inputs = n - num_outputs + len(in_out)
        for i, a in enumerate(args):
            if a.name in in_out:
                if i >= self.num_inputs:
                    raise ValueError(f"Expected an output-only argument for argument {a.name}. in_out arguments "
                                     "should be placed before output-only arguments.")
                if not a.is_array:
                    raise TypeError(f"in-out argument '{a.name}' must be an array")
                a.in_out = True
                in_out.discard(a.name)
            if i >= self.num_inputs:
                if not a.is_array:
                    raise TypeError("All output arguments must be arrays")
                a.role = "output"
            elif a.in_out:
                a.role = "inout"
        if in_out:
            raise ValueError(f"in_out_argnames: '{in_out}' did not match any function argument names.")
        self.stage_in = set(stage_in_argnames) if stage_in_argnames else None
        self.stage_out = set(stage_out_argnames) if stage_out_argnames else None
        known = {a.name for a in args}
        for what, s in (("stage_in_argnames", self.stage_in), ("stage_out_argnames", self.stage_out)):
            if s and not s <= known:
                raise ValueError(f"{what}: {sorted(s - known)} did not match any function argument names.")
        self.inputs = args[:self.num_inputs]
        self.outputs = args[self.num_inputs:]
        self.first_array = next((i for i, a in enumerate(self.inputs) if a.is_array), None)

    def staged(self, a):
        ins = self.stage_in is None or a.name in self.stage_in
        outs = self.stage_out is None or a.name in self.stage_out
        return {"input": ins, "output": outs, "inout": ins or outs}[a.role]

    @classmethod
    def of_function(cls, func, num_outputs, **kw):
        warp_modules()
        from warp._src.codegen import get_full_arg_spec, make_full_qualified_name
        spec = get_full_arg_spec(func)
        ann = dict(spec.annotations)
        ret = ann.pop("return", None)
        if ret is not None:
            raise TypeError("Function must not return a value")
        name = make_full_qualified_name(func)
        if len(ann) < len(spec.args):
            raise RuntimeError(f"Incomplete argument annotations on function {name}")
        args = [ArgInfo(a, ann[a]) for a in spec.args]
        return cls(name, args, num_outputs, **kw)

    @classmethod
    def of_kernel(cls, kernel, num_outputs, **kw):
        args = [ArgInfo(a.label, a.type) for a in kernel.adj.args]
        return cls(kernel.key, args, num_outputs, **kw)


def record(func, spec, shapes, statics, ordinal=0, arch=None):
    """One run of func on reserved CPU arrays: shapes maps argument index
    to Warp shape, statics maps index to value. The function sees CUDA
    device `ordinal` (of architecture `arch`) as Warp's current device."""
    wp, _, _ = warp_modules()
    rec = Recording()
    args = [None] * len(spec.args)
    try:
        with Recorder(rec, spec.name, ordinal, arch):
            for i, a in enumerate(spec.args):
                if a.is_array:
                    shape = shapes[i]
                    n = 1
                    for d in shape:
                        n *= d
                    # An empty array has no memory and no slot: its data
                    # pointer is null, as XLA and Warp give it.
                    p = arg_buffer(rec, i, n * a.itemsize, f"argument {a.name}") if n else 0
                    args[i] = wp.array(ptr=p, dtype=a.dtype, shape=shape, device="cpu")
                else:
                    args[i] = statics[i]
            with wp.ScopedDevice("cpu"):
                func(*args)
    finally:
        del args
        release_args(rec)
    return rec


class Function:
    """A Warp function (or a kernel launch) and its programs, one per
    signature: (Warp shapes of the array arguments, static values,
    architecture, mode)."""

    def __init__(self, func, spec):
        self.func = func
        self.spec = spec
        self.built = {}
        self.lock = threading.Lock()

    def build(self, shapes, statics, arch, mode, func=None, extra=None, ordinal=0):
        """The Built program for these Warp shapes ({argument index:
        shape}) and static values ({index: value}); func replaces the
        function to record (a kernel launch), extra goes into the cache
        key with it. ordinal: the CUDA device the function sees as current
        while it is recorded."""
        func = self.func if func is None else func
        key = (tuple(tuple(shapes[i]) if i in shapes else None for i in range(len(self.spec.args))),
               tuple(sorted((i, type(v).__name__, repr(v)) for i, v in statics.items())), arch, mode, extra)
        with self.lock:
            hit = self.built.get(key)
            if hit is not None:
                return hit
            first = record(func, self.spec, shapes, statics, ordinal, arch)
            second = record(func, self.spec, shapes, statics, ordinal, arch)
            if first.key() != second.key():
                raise Refused("value_dependent", f"{self.spec.name}: two recordings of the same shapes and static "
                              "values launched different sequences, so the launches depend on something else "
                              f"(values, time, randomness, state kept between calls): {_first_difference(first, second)}")
            args = [(i, a.role, self.spec.staged(a), _nbytes(a, shapes[i]), a.name)
                    for i, a in enumerate(self.spec.args) if a.is_array]
            b = assemble(first, args, mode, arch, self.spec.name)
            self.built[key] = b
            return b


def _nbytes(a, shape):
    n = a.itemsize
    for d in shape:
        n *= d
    return n


def _first_difference(a, b):
    ka, kb = a.key(), b.key()
    if len(ka) != len(kb):
        return f"{len(ka)} steps, then {len(kb)}"
    for i, (x, y) in enumerate(zip(ka, kb)):
        if x != y:
            return f"step {i} differs ({x[0]} {x[2] if x[0] == 'launch' else ''})"
    return "the steps differ"
