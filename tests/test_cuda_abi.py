"""Every driver entry point in common/cuda_driver.h is resolved at an ABI
whose parameters are those of the prototype cuda.h declares for its name.

cuGetProcAddress(name, CUDA_VERSION) returns the newest ABI of `name` up to
that version, which cudaTypedefs.h lists as PFN_<name>_v<N>. Where CUDA
gave a name a new ABI without cuda.h mapping the name to it (CUDA 13's
cuCtxSynchronize takes a CUcontext), the table's field would be called
with the wrong arguments. Such names must be in GD_CUDA_OLD_ABI with the
version of cuda.h's prototype.

Usage: test_cuda_abi.py CUDA_INCLUDE_DIR SOURCE_DIR"""
import re
import sys


def params(text):
    text = " ".join(text.split())
    if text in ("", "void"):
        return 0
    depth, n = 0, 1
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        n += ch == "," and depth == 0
    return n


def main():
    inc, src = sys.argv[1], sys.argv[2]
    cuda = open(f"{inc}/cuda.h").read()
    typedefs = open(f"{inc}/cudaTypedefs.h").read()
    version = int(re.search(r"#define CUDA_VERSION (\d+)", cuda).group(1))
    names = re.findall(r"X\((cu\w+)\)", open(f"{src}/common/cuda_driver.h").read())
    old = dict((n, int(v)) for n, v in re.findall(r'\{"(cu\w+)", (\d+)\}',
                                                   open(f"{src}/common/cuda_driver.c").read()))
    renames = dict(re.findall(r"#define\s+(cu\w+)\s+(cu\w+)\b", cuda))
    bad = []
    for name in names:
        # cuda.h writes a renamed function's prototype under either name
        # (the first one is the public declaration).
        real = renames.get(name, name)
        m = None
        for n in [name, real] + [k for k, v in renames.items() if v == name]:
            m = m or re.search(r"CUresult\s+CUDAAPI\s+%s\s*\((.*?)\);" % re.escape(n), cuda, re.S)
        if not m:
            bad.append(f"{name}: no prototype for {real} in cuda.h")
            continue
        want = params(m.group(1))
        abis = {int(v): params(a) for v, a in re.findall(
            r"typedef CUresult \(CUDAAPI \*PFN_%s_v(\d+)\)\((.*?)\);" % name, typedefs, re.S)}
        if not abis:
            bad.append(f"{name}: no PFN_{name}_v* in cudaTypedefs.h")
            continue
        at = old.get(name, version)
        got_v = max(v for v in abis if v <= at)
        if abis[got_v] != want:
            bad.append(f"{name}: cuGetProcAddress at {at} gives the v{got_v} ABI with "
                       f"{abis[got_v]} parameters, cuda.h's {real} has {want}: add it to "
                       f"GD_CUDA_OLD_ABI with the version of that prototype")
    for name in old:
        if name not in names:
            bad.append(f"GD_CUDA_OLD_ABI lists {name}, which the table does not have")
    for b in bad:
        print("FAIL:", b)
    print(f"{len(names)} entry points checked against CUDA {version}'s headers, "
          f"{len(old)} at an older ABI")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
