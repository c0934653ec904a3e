"""Distributed shared memory (sm90 thread block clusters): reading a peer CTA's shared memory.

nvidia-cutlass-dsl 4.8.1 maps a shared-memory pointer into a peer's window (``cute.arch.map_dsmem_ptr``, PTX
``mapa``) but cannot load through the resulting pointer (its tensors refuse load/store, and ``cute.arch.load``
takes only generic, global or shared pointers), so the load is one PTX ``ld.shared::cluster`` on the 32-bit
address. Imported only to compile (the DSL).
"""
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


def peer_address(smem_ptr: cute.Pointer, rank: Int32) -> Int32:
    """The 32-bit shared::cluster address of ``smem_ptr`` (this CTA's shared memory) in the CTA of cluster
    rank ``rank``."""
    return Int32(cute.arch.map_dsmem_ptr(smem_ptr, rank).toint())


@dsl_user_op
def load_f32(address: Int32, *, loc=None, ip=None) -> Float32:
    """One fp32 from a shared::cluster address (``peer_address`` + 4 x element offset); the caller orders it after
    the peer's writes with a cluster barrier (``barrier.cluster.arrive`` releases, ``wait`` acquires)."""
    return Float32(llvm.inline_asm(T.f32(), [Int32(address).ir_value(loc=loc, ip=ip)],
                                   "ld.shared::cluster.f32 $0, [$1];", "=f,r", has_side_effects=True,
                                   is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))
