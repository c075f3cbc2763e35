//! Entry program for every api whose arguments all sit in registers (copies, waits, graph
//! launches, memory, name lookups): the six argument registers are kept as they are, but for the
//! copies whose sizes sit in memory (2-D, 3-D and batch copies), read by `params`.
use aya_ebpf::{macros::uprobe, programs::ProbeContext};
use tracer_common::api::{COOKIE_BATCH, COOKIE_PARAMS_2D, COOKIE_PARAMS_3D};

use crate::entry::{arg, cookie, save_with};

#[uprobe]
pub fn cuda_regs(ctx: ProbeContext) -> u32 {
    try_cuda_regs(&ctx);
    0
}

#[inline(always)]
fn try_cuda_regs(ctx: &ProbeContext) {
    let cookie = cookie(ctx);
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
    save_with(ctx, cookie, args);
}
