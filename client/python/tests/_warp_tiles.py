"""The tile kernel the Warp tests launch (test_warp on the CPU, test_warp_gpu
on a GPU): a block of TILE threads per row of a 2-D array, summing the row
as a tile. Imports Warp: import it only where Warp is importable."""

import warp as wp

TILE = 64


@wp.kernel
def row_sum(a: wp.array2d(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    t = wp.tile_load(a[i], shape=TILE)
    wp.tile_store(out, wp.tile_sum(t), offset=i)


def row_sums(a: wp.array2d(dtype=float), out: wp.array(dtype=float)):
    """One block of TILE threads per row (wp.launch_tiled)."""
    wp.launch_tiled(row_sum, dim=[a.shape[0]], inputs=[a], outputs=[out], block_dim=TILE)
