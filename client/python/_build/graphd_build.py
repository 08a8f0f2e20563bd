"""A PEP 517 build backend for the graphd package, in the standard library
only.

Why not setuptools: the package is pure Python, and setuptools before 70.1
cannot build a wheel without the separate `wheel` package, which machines
that must install offline (CI, the GPU host) do not always have. This
backend needs nothing, so `pip install --no-build-isolation --no-deps
client/python` works anywhere pip does. It builds:
- a wheel of graphd/*.py, plus graphd/libgraphd.so when one was copied
  there (then found without $GRAPHD_LIB);
- an editable wheel (pip install -e) that is a .pth file naming this
  directory;
- an sdist.
Name and version come from pyproject.toml's [project] table."""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _meta():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    proj = text.split("[project]", 1)[1].split("\n[", 1)[0]

    def field(k):
        m = re.search(rf'^{k}\s*=\s*"([^"]*)"', proj, re.M)
        return m.group(1) if m else ""
    return field("name"), field("version"), field("description"), field("requires-python")


def _metadata():
    name, version, desc, pyreq = _meta()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: {desc}"]
    if pyreq:
        lines.append(f"Requires-Python: {pyreq}")
    return "\n".join(lines) + "\n"


def _files():
    pkg = os.path.join(ROOT, "graphd")
    for n in sorted(os.listdir(pkg)):
        if n.endswith(".py") or n == "libgraphd.so":
            yield os.path.join(pkg, n), f"graphd/{n}"


def _wheel(wheel_directory, entries):
    """entries: (archive name, bytes). Writes the wheel, returns its name."""
    name, version, _, _ = _meta()
    dist = f"{name}-{version}.dist-info"
    entries = list(entries) + [
        (f"{dist}/METADATA", _metadata().encode()),
        (f"{dist}/WHEEL", b"Wheel-Version: 1.0\nGenerator: graphd_build\nRoot-Is-Purelib: true\n"
                          b"Tag: py3-none-any\n"),
        (f"{dist}/top_level.txt", f"{name}\n".encode()),
    ]
    record = []
    for arc, data in entries:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{arc},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    fname = f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, fname), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in entries:
            z.writestr(arc, data)
        z.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return fname


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    entries = []
    for path, arc in _files():
        with open(path, "rb") as f:
            entries.append((arc, f.read()))
    return _wheel(wheel_directory, entries)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name, _, _, _ = _meta()
    return _wheel(wheel_directory, [(f"__editable__.{name}.pth", (ROOT + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    name, version, _, _ = _meta()
    base = f"{name}-{version}"
    fname = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, fname), "w:gz") as t:
        for rel in ["pyproject.toml", "_build/graphd_build.py"] + [a for _, a in _files()
                                                                    if not a.endswith(".so")]:
            t.add(os.path.join(ROOT, rel), arcname=f"{base}/{rel}")
        info = _metadata().encode()
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size = len(info)
        t.addfile(ti, io.BytesIO(info))
    return fname
