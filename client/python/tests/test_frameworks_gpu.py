"""Client.replay_arrays(program, *arrays) on a GPU with PyTorch tensors and CuPy
arrays: bit-exact replays, a tensor smaller than its slot refused with its
neighbours untouched, slots bound to views at an offset, the framework's
current stream followed, torch.cuda.empty_cache() and CuPy's
free_all_blocks() between replays with new memory (often at the same
address), a cupy.RawKernel compiled by NVRTC as a graphd program, and the
examples of docs/pytorch.md, docs/cupy.md and docs/jax.md (docs/examples/).

Run by tests/run_frameworks_gpu.sh (ctest label gpu) in a python with
torch, cupy and jax. Without a GPU, torch, cupy, jax or libgraphd_xla a
class skips; with GRAPHD_REQUIRE_GPU=1 that is a failure."""

import os
import subprocess
import sys
import tempfile
import unittest

import _gpu_common
from _gpu_common import unavailable

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "..", "docs", "examples")
N = 1 << 16


def _need(module):
    why = None
    try:
        m = __import__(module)
        if module == "torch" and not m.cuda.is_available():
            why = "torch sees no GPU"
        if module == "cupy" and m.cuda.runtime.getDeviceCount() < 1:
            why = "cupy sees no GPU"
        if module == "jax" and not m.devices("gpu"):
            why = "jax sees no GPU"
        if module == "jax" and not os.environ.get("GRAPHD_XLA_LIB"):
            why = "this build has no libgraphd_xla"
    except Exception as e:  # noqa: BLE001: any failure to find the framework or a GPU
        why = f"no {module} with CUDA here ({e})"
    if why:
        unavailable(why)
    return m


class Daemon(_gpu_common.Daemon):
    """graphd --backend cuda on a temporary socket, started."""

    def __init__(self):
        super().__init__(os.path.join(tempfile.mkdtemp(prefix="graphd-fw-"), "s"), log_level="warn")
        self.start()

    def run_example(self, test, *argv):
        env = dict(os.environ, GRAPHD_SOCKET=self.sock)
        r = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True,
                           timeout=300)
        test.assertEqual(r.returncode, 0, f"{argv}: {r.stdout}{r.stderr}")
        return r.stdout


def scale_program(graphd, cubin, n, a=2.0, x_role="input", y_role="output", dtype="float32"):
    p = graphd.Program("staged")
    x = p.add_slot(x_role, 4 * n, dtype=dtype)
    y = p.add_slot(y_role, 4 * n, dtype=dtype)
    p.launch(graphd.module_id("cubin", cubin), "scale", (n + 255) // 256, 256,
             args=[graphd.Slot(x), graphd.Slot(y), graphd.f32(a), graphd.u32(n)])
    return p


class TorchTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.torch = _need("torch")
        import graphd
        import graphd.torch
        cls.graphd = graphd
        with open(os.path.join(os.environ["GRAPHD_CUDA_KERNELS"], "test_kernels.cubin"), "rb") as f:
            cls.cubin = f.read()
        cls.daemon = Daemon()
        cls.c = graphd.torch.connect(socket=cls.daemon.sock)
        cls.c.register_module("cubin", cls.cubin)
        cls.p = scale_program(graphd, cls.cubin, N)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.daemon.stop()

    def test_replays_are_bit_exact_with_one_capture(self):
        torch = self.torch
        x = torch.randn(N, device="cuda")
        y = torch.empty_like(x)
        infos = [self.c.replay_arrays(self.p, x, y) for _ in range(3)]
        self.assertEqual([i["captured"] for i in infos][1:], [0, 0])
        self.assertTrue(torch.equal(y, 2 * x))

    def test_a_tensor_smaller_than_its_slot_is_refused_and_its_neighbour_untouched(self):
        torch = self.torch
        x = torch.randn(N, device="cuda")
        y = torch.full((N // 2,), -7.0, device="cuda")
        neighbour = torch.full((N // 2,), -7.0, device="cuda")  # likely next in the segment
        with self.assertRaisesRegex(self.graphd.GraphdError, "but the slot is"):
            self.c.replay_arrays(self.p, x, y)
        torch.cuda.synchronize()
        self.assertTrue(bool((y == -7).all()) and bool((neighbour == -7).all()))

    def test_slots_bound_to_views_at_an_offset(self):
        torch = self.torch
        src = torch.randn(3 * N, device="cuda")
        dst = torch.full((3 * N,), -7.0, device="cuda")
        self.c.replay_arrays(self.p, src[2 * N:], dst[N:2 * N])
        self.assertTrue(torch.equal(dst[N:2 * N], 2 * src[2 * N:]))
        self.assertTrue(bool((dst[:N] == -7).all()) and bool((dst[2 * N:] == -7).all()))

    def test_noncontiguous_and_wrong_dtype_tensors_are_refused(self):
        torch = self.torch
        x = torch.randn(N, device="cuda")
        with self.assertRaisesRegex(self.graphd.GraphdError, "not contiguous"):
            self.c.replay_arrays(self.p, x.view(N // 2, 2).t(), torch.empty(N, device="cuda"))
        with self.assertRaisesRegex(self.graphd.GraphdError, "is float16, but the slot holds float32"):
            self.c.replay_arrays(self.p, x, torch.empty(2 * N, dtype=torch.float16, device="cuda"))
        with self.assertRaisesRegex(self.graphd.GraphdError, "on the CPU"):
            self.c.replay_arrays(self.p, x.cpu(), torch.empty(N, device="cuda"))

    def test_the_replay_follows_torchs_current_stream(self):
        torch = self.torch
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x = torch.randn(N, device="cuda")
            y = torch.empty_like(x)
            for _ in range(5):
                x.add_(1.0)  # queued on s before each replay
                self.c.replay_arrays(self.p, x, y)
            self.assertTrue(torch.equal(y, 2 * x))
        self.assertEqual(self.c._binder._streams[s.cuda_stream].cuda_stream, s.cuda_stream)

    def test_empty_cache_and_new_memory_at_the_same_address_between_replays(self):
        torch = self.torch
        reused = 0
        for i in range(20):
            x = torch.full((N,), float(i), device="cuda")
            y = torch.empty(N, device="cuda")
            before = y.data_ptr()
            self.c.replay_arrays(self.p, x, y)
            self.assertTrue(bool((y == 2.0 * i).all()), f"round {i}")
            del x, y
            # Every array bound is gone: graphd let go of the regions
            # before the allocator could free the memory.
            self.assertEqual(self.c.held_regions(), [])
            torch.cuda.empty_cache()
            y = torch.empty(N, device="cuda")
            reused += y.data_ptr() == before
            del y
        print(f"\n  new memory at the old address in {reused} of 20 rounds", file=sys.stderr)
        self.assertLessEqual(self.c.region_count(), 2)

    def test_a_region_stays_while_a_tensor_in_it_lives(self):
        torch = self.torch
        x = torch.randn(N, device="cuda")
        y = torch.empty_like(x)
        self.c.replay_arrays(self.p, x, y)
        held = self.c.held_regions()
        self.assertTrue(held)
        self.c.replay_arrays(self.p, x, y)
        self.assertEqual(self.c.held_regions(), held)  # the cache, not a new import
        del x, y
        self.assertEqual(self.c.held_regions(), [])

    def test_the_pytorch_example(self):
        out = self.daemon.run_example(self, os.path.join(EXAMPLES, "torch_scale.py"),
                                      os.path.join(os.environ["GRAPHD_CUDA_KERNELS"], "test_kernels.cubin"))
        self.assertIn("torch_scale: ok", out)


class CupyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cupy = _need("cupy")
        import graphd
        import graphd.cupy
        cls.graphd = graphd
        cls.daemon = Daemon()
        cls.c = graphd.cupy.connect(socket=cls.daemon.sock)
        src = r"""
        extern "C" __global__ void scale(const float *x, float *y, float a, unsigned n) {
          unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
          if (i < n) y[i] = a * x[i];
        }"""
        cls.raw = cls.cupy.RawKernel(src, "scale")
        cls.k = graphd.cupy.Kernel(cls.raw)
        cls.c.register_module(*cls.k.module)
        p = graphd.Program("staged")
        x = p.add_slot("input", 4 * N, dtype="float32")
        y = p.add_slot("output", 4 * N, dtype="float32")
        cls.k.launch(p, N // 256, 256, [graphd.Slot(x), graphd.Slot(y), graphd.f32(2.0), graphd.u32(N)])
        cls.p = p

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.daemon.stop()

    def test_a_rawkernel_replays_bit_exact_against_cupys_own_launch(self):
        cp = self.cupy
        x = cp.random.standard_normal(N, dtype=cp.float32)
        want = cp.empty_like(x)
        self.raw((N // 256,), (256,), (x, want, cp.float32(2.0), cp.uint32(N)))
        y = cp.empty_like(x)
        self.c.replay_arrays(self.p, x, y)
        self.assertTrue(bool((y == want).all()))
        self.assertEqual(self.k.module[0], "cubin")

    def test_an_array_smaller_than_its_slot_is_refused(self):
        cp = self.cupy
        x = cp.ones(N, dtype=cp.float32)
        y = cp.full(N // 2, -7, dtype=cp.float32)
        with self.assertRaisesRegex(self.graphd.GraphdError, "but the slot is"):
            self.c.replay_arrays(self.p, x, y)
        self.assertTrue(bool((y == -7).all()))

    def test_a_view_at_an_offset(self):
        cp = self.cupy
        src = cp.arange(2 * N, dtype=cp.float32)
        dst = cp.full(3 * N, -7, dtype=cp.float32)
        self.c.replay_arrays(self.p, src[N:], dst[N:2 * N])
        self.assertTrue(bool((dst[N:2 * N] == 2 * src[N:]).all()))
        self.assertTrue(bool((dst[:N] == -7).all()) and bool((dst[2 * N:] == -7).all()))

    def test_the_replay_follows_cupys_current_stream(self):
        cp = self.cupy
        with cp.cuda.Stream(non_blocking=True) as s:
            x = cp.zeros(N, dtype=cp.float32)
            y = cp.empty_like(x)
            for _ in range(5):
                x += 1
                self.c.replay_arrays(self.p, x, y)
            self.assertTrue(bool((y == 10).all()))
        self.assertIn(s.ptr, self.c._binder._streams)

    def test_free_all_blocks_and_new_memory_between_replays(self):
        cp = self.cupy
        pool = cp.get_default_memory_pool()
        for i in range(20):
            x = cp.full(N, i, dtype=cp.float32)
            y = cp.empty(N, dtype=cp.float32)
            self.c.replay_arrays(self.p, x, y)
            self.assertTrue(bool((y == 2 * i).all()), f"round {i}")
            del x, y
            self.assertEqual(self.c.held_regions(), [])
            pool.free_all_blocks()
        self.assertLessEqual(self.c.region_count(), 2)

    def test_the_cupy_example(self):
        out = self.daemon.run_example(self, os.path.join(EXAMPLES, "cupy_saxpy.py"))
        self.assertIn("cupy_saxpy: ok", out)


class JaxTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        _need("jax")
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def test_the_jax_example(self):
        out = self.daemon.run_example(self, os.path.join(EXAMPLES, "jax_scale.py"),
                                      os.path.join(os.environ["GRAPHD_CUDA_KERNELS"], "test_kernels.cubin"))
        self.assertIn("jax_scale: ok", out)


if __name__ == "__main__":
    unittest.main()
