"""A kernel that views and assembles one parameter in a loop (no ``from __future__ import
annotations``: PyPTO's jit evaluates the parameter annotations)."""

__all__ = ["in_place_kernel", "main"]


def in_place_kernel(bk):
    pypto = bk.pypto
    fp32 = pypto.DT_FP32

    @pypto.frontend.jit(**bk.jit_options())
    def in_place(x: pypto.Tensor((4, 8), fp32), state: pypto.Tensor((32, 8), fp32)):
        for i in pypto.loop(4):
            pypto.set_vec_tile_shapes(1, 8)
            row = pypto.view(x, [1, 8], [i, 0])
            pypto.set_vec_tile_shapes(8, 8)
            s = pypto.view(state, [8, 8], [i * 8, 0])
            pypto.assemble(s + row, [i * 8, 0], state)

    return in_place


def main():
    """Run the kernel once; print the error PyPTO raises (run in a fresh process: a failed
    build leaves PyPTO 0.2.0 broken in-process, "function nested is not allowed")."""
    import tempfile
    from pathlib import Path

    import torch

    from pypto_kernels_common import backend, sim

    sim.use_run_folders(Path(tempfile.mkdtemp(prefix="pypto-inplace-probe-")))
    sim.prepare_environment()
    try:
        in_place_kernel(backend("cpu"))(torch.ones(4, 8), torch.zeros(32, 8))
    except Exception as err:
        print(f"refused: {type(err).__name__}: {err}")
        return
    print("accepted")


if __name__ == "__main__":
    main()
