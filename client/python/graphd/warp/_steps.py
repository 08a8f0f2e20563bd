"""What a recording holds, as plain records: the memory ranges it knows
(Buffer) and the steps the function ran (launches with their packed
parameters, memsets, copies, loops and branches). The recorder (_record)
makes them, the parameter packer (_params) fills a launch's, and the
assembler (_build) turns them into a program; this module imports none
of them, nor Warp."""


class Buffer:
    """A memory range the recording knows: an argument (`arg` is its
    position among the function's arguments), an allocation made inside
    the function (`alloc` is its order among them), or the memory of a
    Warp array made outside the function that a launch passes (`fixed`:
    that array, kept alive with the program; bound at its own address)."""

    def __init__(self, base, size, arg=None, alloc=None, what="", fixed=None):
        self.base, self.size = base, size
        self.arg, self.alloc = arg, alloc
        self.fixed = fixed
        self.what = what
        self.used = False
        self.alive = True

    def key(self):
        if self.fixed is not None:
            return ("fixed", self.base, self.size)
        return ("arg", self.arg) if self.arg is not None else ("alloc", self.alloc, self.size)


class Param:
    """One kernel parameter: its bytes (pointer fields zeroed), C alignment
    and the pointers inside it as (offset in the parameter, buffer, offset
    in the buffer)."""

    def __init__(self, name, data, align, pointers):
        self.name, self.data, self.align, self.pointers = name, data, align, pointers

    def key(self):
        return (self.data, self.align, tuple((o, b.key(), bo) for o, b, bo in self.pointers))


class LaunchRec:
    kind = "launch"

    def __init__(self, kernel, adjoint, dim, block_dim, max_blocks, params):
        self.kernel, self.adjoint, self.dim = kernel, adjoint, dim
        self.block_dim, self.max_blocks, self.params = block_dim, max_blocks, params

    def key(self):
        return ("launch", self.kernel.module.name, self.kernel.key, self.kernel.sig, self.adjoint, self.dim,
                self.block_dim, self.max_blocks, tuple(p.key() for p in self.params))


class MemsetRec:
    kind = "memset"

    def __init__(self, buf, offset, nbytes, element_size, value):
        self.buf, self.offset, self.nbytes = buf, offset, nbytes
        self.element_size, self.value = element_size, value

    def key(self):
        return ("memset", self.buf.key(), self.offset, self.nbytes, self.element_size, self.value)


class CopyRec:
    kind = "copy"

    def __init__(self, dst, dst_offset, src, src_offset, nbytes):
        self.dst, self.dst_offset, self.src, self.src_offset = dst, dst_offset, src, src_offset
        self.nbytes = nbytes

    def key(self):
        return ("copy", self.dst.key(), self.dst_offset, self.src.key(), self.src_offset, self.nbytes)


class CondRec:
    """A loop (kind "while") or a branch ("if") over the 4-byte int32 at
    `offset` of `buf`: a loop runs `body` while it is non-zero, reading it
    before each pass; a branch runs `body` when it is non-zero and `orelse`
    when it is zero. body and orelse are lists of records, nested ones
    included."""

    def __init__(self, kind, buf, offset, body, orelse):
        self.kind, self.buf, self.offset = kind, buf, offset
        self.body, self.orelse = body, orelse

    def key(self):
        return (self.kind, self.buf.key(), self.offset, tuple(s.key() for s in self.body),
                tuple(s.key() for s in self.orelse))


def count_steps(steps):
    """Program steps of a list of records: a loop or a branch is one step
    plus those of its sides."""
    n = 0
    for s in steps:
        n += 1
        if s.kind in ("while", "if"):
            n += count_steps(s.body) + count_steps(s.orelse)
    return n


class Recording:
    """The buffers and steps of one run of the function. `steps` is where
    records go: a loop's or a branch's callbacks run with it swapped for
    their own list."""

    def __init__(self):
        self.buffers = []
        self.steps = []
        self.allocs = 0

    def key(self):
        return tuple(s.key() for s in self.steps)

    def find(self, ptr, nbytes=1):
        """(buffer, offset) holding [ptr, ptr + nbytes), or None. Only live
        buffers count: a freed allocation's addresses may be handed out
        again, to a new buffer."""
        for b in reversed(self.buffers):
            if b.alive and b.base <= ptr and ptr + nbytes <= b.base + b.size:
                return b, ptr - b.base
        return None


def resolve_block_dim(block_dim):
    """The CUDA block size Warp launches with: 256 unless a positive one is
    asked for."""
    return 256 if block_dim is None or block_dim <= 0 else int(block_dim)
