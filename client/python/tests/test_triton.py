"""graphd.triton without Triton: a stand-in for a compiled kernel whose PTX
has the shape Triton 3.x emits (runtime parameters, then two hidden scratch
pointers). The real kernel runs in test_jax_gpu.py on the GPU machine."""

import types
import unittest

from graphd import GraphdError, Program, Slot, f32, u32, module_id
from graphd import triton as gt

PTX = """
//
.version 8.7
.target sm_90a
.address_size 64
.visible .entry axpy_kernel(
	.param .u64 .ptr .global .align 1 axpy_kernel_param_0,
	.param .u64 .ptr .global .align 1 axpy_kernel_param_1,
	.param .u64 .ptr .global .align 1 axpy_kernel_param_2,
	.param .f32 axpy_kernel_param_3,
	.param .u32 axpy_kernel_param_4,
	.param .u64 .ptr .global .align 1 axpy_kernel_param_5,
	.param .u64 .ptr .global .align 1 axpy_kernel_param_6
)
.reqntid 128
{
	ret;
}
"""
CUBIN = b"\x7fELF not really a cubin"


def compiled(**md):
    meta = dict(name="axpy_kernel", num_warps=4, shared=0, num_ctas=1)
    meta.update(md)
    return types.SimpleNamespace(asm={"ptx": PTX, "cubin": CUBIN},
                                 metadata=types.SimpleNamespace(**meta))


class TritonKernelTest(unittest.TestCase):
    def test_reads_name_block_shared_and_every_parameter(self):
        k = gt.Kernel(compiled(shared=512))
        self.assertEqual((k.name, k.block, k.shared, k.params), ("axpy_kernel", 128, 512, 7))
        self.assertEqual(k.module, ("cubin", CUBIN))
        self.assertEqual(k.module_id, module_id("cubin", CUBIN))
        self.assertEqual(k.hidden(5), 2)

    def test_launch_declares_the_hidden_pointers_as_null(self):
        k = gt.Kernel(compiled())
        p = Program()
        x, y, o = p.add_slot("input", 256), p.add_slot("input", 256), p.add_slot("output", 256)
        s = k.launch(p, 1, [Slot(x), Slot(y), Slot(o), f32(2.0), u32(64)])
        l = p._steps[s]
        # x, y, out at 0/8/16, a at 24, n at 28, then two hidden pointers.
        self.assertEqual(l.params, [(0, 8), (8, 8), (16, 8), (24, 4), (28, 4), (32, 8), (40, 8)])
        self.assertEqual(bytes(l.data[32:48]), bytes(16))
        self.assertEqual(l.block, (128, 1, 1))
        self.assertEqual(l.patches, [(0, x, 0), (8, y, 0), (16, o, 0)])
        p.finish()

    def test_too_many_arguments_is_a_clear_error(self):
        k = gt.Kernel(compiled())
        with self.assertRaises(GraphdError) as cm:
            k.launch(Program(), 1, [Slot(0)] * 8)
        self.assertEqual(cm.exception.code, "INVALID_ARGUMENT")
        self.assertIn("8 arguments given but the entry takes 7 parameters", cm.exception.message)

    def test_refuses_what_is_not_a_usable_compiled_kernel(self):
        for bad, why in ((object(), "not a compiled Triton kernel"),
                         (compiled(num_ctas=2), "num_ctas=2"),
                         (compiled(name="other"), "no .entry other"),
                         (types.SimpleNamespace(asm={"ptx": PTX}, metadata=compiled().metadata),
                          "no cubin or ptx")):
            with self.subTest(why=why):
                with self.assertRaises(GraphdError) as cm:
                    gt.Kernel(bad)
                self.assertIn(why, cm.exception.message)


if __name__ == "__main__":
    unittest.main()
