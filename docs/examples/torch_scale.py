"""docs/pytorch.md's example: a CUDA kernel replayed by graphd on PyTorch
tensors, on PyTorch's current stream.

    nvcc -cubin -arch=sm_90 -o scale.cubin docs/examples/scale.cu
    GRAPHD_SOCKET=/run/graphd/graphd.sock python3 docs/examples/torch_scale.py scale.cubin
"""
import sys

import torch

import graphd
import graphd.torch
from graphd import Program, Slot, f32, u32

cubin = open(sys.argv[1], "rb").read()
n = 1 << 20
x = torch.randn(n, device="cuda")
y = torch.empty_like(x)

# The program: one launch of scale(x, y, 2.0, n). Its slots are sized and
# typed like the tensors, so a tensor of another size or dtype is refused.
p = Program("staged")
xs = graphd.arrays.slot_like(p, "input", x)
ys = graphd.arrays.slot_like(p, "output", y)
p.launch(graphd.module_id("cubin", cubin), "scale", grid=n // 256, block=256,
         args=[Slot(xs), Slot(ys), f32(2.0), u32(n)])

with graphd.torch.connect() as c:  # a session on the current GPU
    c.register_module("cubin", cubin)
    info = c.replay_arrays(p, x, y)  # captured on the first replay
    assert info["captured"]
    assert torch.equal(y, 2 * x)  # queued after the replay on the same stream

    # On another stream: the replay follows PyTorch's current stream.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x2 = torch.randn(n, device="cuda")
        y2 = torch.empty_like(x2)
        c.replay_arrays(p, x2, y2)  # the same capture, on s
        assert torch.equal(y2, 2 * x2)

    # A view is bound by its own bytes: here the middle third of a buffer.
    buf = torch.zeros(3 * n, device="cuda")
    c.replay_arrays(p, x, buf[n:2 * n])
    assert torch.equal(buf[n:2 * n], 2 * x) and not buf[:n].any() and not buf[2 * n:].any()

    # A tensor smaller than its slot is refused before anything runs.
    try:
        c.replay_arrays(p, x, buf[:n // 2])
        raise AssertionError("a half-size output was accepted")
    except graphd.GraphdError as e:
        assert e.code == "INVALID_ARGUMENT", e
print("torch_scale: ok")
