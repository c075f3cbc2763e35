//! Entry program for every api whose arguments all sit in registers (copies, waits, graph
//! launches, memory, name lookups): the six argument registers are kept as they are, but for the
//! copies whose sizes sit in memory (2-D, 3-D and batch copies), read by `params`.
use aya_ebpf::EbpfContext;
use aya_ebpf::{helpers::generated::bpf_get_attach_cookie, macros::uprobe, programs::ProbeContext};
use tracer_common::api::{COOKIE_BATCH, COOKIE_PARAMS_2D, COOKIE_PARAMS_3D};

use crate::entry::{arg, save};

#[uprobe]
pub fn cuda_regs(ctx: ProbeContext) -> u32 {
    try_cuda_regs(&ctx);
    0
}

#[inline(always)]
fn try_cuda_regs(ctx: &ProbeContext) {
    // SAFETY: the context pointer is the program's own, as bpf_get_attach_cookie requires.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let args = if cookie & (COOKIE_PARAMS_2D | COOKIE_PARAMS_3D | COOKIE_BATCH) != 0 {
        super::params::read(ctx, cookie)
    } else {
        [
            arg(ctx, 0),
            arg(ctx, 1),
            arg(ctx, 2),
            arg(ctx, 3),
            arg(ctx, 4),
            arg(ctx, 5),
        ]
    };
    save(ctx, args);
}
