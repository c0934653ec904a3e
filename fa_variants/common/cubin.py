"""What a compiled kernel became: resources from the cubin's ELF and instruction counts from its SASS.

The ELF facts (``.nv.info`` EIATTR_REGCOUNT 0x2f, EIATTR_FRAME_SIZE 0x11, ``.nv.shared.<kernel>`` section
size) are those ``cuobjdump -res-usage`` reports; the SASS comes from ``nvdisasm``, the binary the CuTe DSL
itself uses for ``CUTE_DSL_KEEP=sass`` (the ``[sass]`` extra of nvidia-cutlass-dsl-libs-base).
"""
from __future__ import annotations

import os
import re
import struct
import subprocess
import tempfile

SASS_OPCODES = ("HMMA", "HGMMA", "QGMMA", "LDGSTS", "LDSM", "UTMALDG", "UTMASTG", "USETMAXREG",
                "MUFU.EX2", "LDL", "STL")

_EIATTR_FRAME_SIZE = 0x11
_EIATTR_REGCOUNT = 0x2F


def _elf_sections(blob: bytes) -> dict[str, tuple[int, int, int, int]]:
    """name -> (offset, size, sh_info, sh_flags) of an ELF64 little-endian file."""
    if blob[:4] != b"\x7fELF" or blob[4] != 2:
        raise ValueError("not an ELF64 cubin")
    e_shoff, = struct.unpack_from("<Q", blob, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    headers = []
    for i in range(e_shnum):
        name, _typ, flags, _addr, off, size, _link, info = struct.unpack_from(
            "<IIQQQQII", blob, e_shoff + i * e_shentsize)
        headers.append((name, off, size, info, flags))
    str_off = headers[e_shstrndx][1]
    out = {}
    for name, off, size, info, flags in headers:
        end = blob.index(b"\0", str_off + name)
        out[blob[str_off + name:end].decode()] = (off, size, info, flags)
    return out


def _nv_info(blob: bytes, off: int, size: int) -> dict[int, int]:
    """EIATTR attribute -> value for the (sym, value) records of one .nv.info.<kernel> section."""
    attrs, pos, end = {}, off, off + size
    while pos + 4 <= end:
        fmt, attr, val = struct.unpack_from("<BBH", blob, pos)
        pos += 4
        if fmt == 0x04:  # EIFMT_SVAL: `val` bytes of payload
            if val == 8:
                _sym, value = struct.unpack_from("<II", blob, pos)
                attrs[attr] = max(attrs.get(attr, 0), value)
            pos += val
    return attrs


def cubin_resources(cubin: bytes) -> dict:
    """Per-kernel maxima from a cubin: registers/thread, static shared memory bytes, local-memory
    (stack frame, where spills go) bytes/thread, number of kernels."""
    secs = _elf_sections(cubin)
    regs = smem = frame = kernels = 0
    for name, (off, size, info, _flags) in secs.items():
        if name.startswith(".text."):
            kernels += 1
            regs = max(regs, info >> 24)
        elif name.startswith(".nv.shared.") and not name.startswith(".nv.shared.reserved"):
            smem = max(smem, size)
        elif name == ".nv.info" or name.startswith(".nv.info."):
            a = _nv_info(cubin, off, size)
            regs = max(regs, a.get(_EIATTR_REGCOUNT, 0))
            frame = max(frame, a.get(_EIATTR_FRAME_SIZE, 0))
    return {"kernels": kernels, "registers": regs, "smem_static_bytes": smem, "spill_bytes": frame}


def _nvdisasm() -> str:
    try:
        from cutlass.base_dsl.env_manager import _find_nvdisasm_binary

        return _find_nvdisasm_binary()
    except Exception as exc:  # noqa: BLE001 - report what is missing, on one line
        why = " ".join(str(getattr(exc, "message", None) or exc).split())  # the DSL's own error is several lines
        raise ImportError("--sass needs nvdisasm, from the [sass] extra: pip install 'fa-variants[sass]'"
                          f" ({why})") from exc


def sass_of(cubin: bytes, encodings: bool = False) -> str:
    """SASS text of a cubin (nvdisasm, the binary the DSL itself uses for CUTE_DSL_KEEP=sass); ``encodings``: with
    each instruction's two 64-bit words (nvdisasm -hex; the second holds the scheduling control bits that
    scripts/sass_diff.py --stalls reads)."""
    with tempfile.TemporaryDirectory(prefix="fa_variants_sass_") as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        res = subprocess.run([_nvdisasm(), "-c", *(["-hex"] if encodings else []), path], capture_output=True,
                             encoding="utf-8", errors="replace", check=True)
    return res.stdout


def count_sass(sass: str, opcodes: tuple[str, ...] = SASS_OPCODES) -> dict[str, int]:
    """Instruction counts by opcode prefix: 'HMMA' counts HMMA.16816.F32.BF16 etc.; predicated
    instructions (@P0 ...) count too."""
    counts = dict.fromkeys(opcodes, 0)
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if not m:
            continue
        op = m.group(1)
        for want in opcodes:
            if op == want or op.startswith(want + "."):
                counts[want] += 1
    return counts
