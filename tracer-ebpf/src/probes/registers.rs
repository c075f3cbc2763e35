//! Entry program for every api whose arguments all sit in registers (copies, waits, graph
//! launches, memory, name lookups): the six argument registers are kept as they are.
use aya_ebpf::{macros::uprobe, programs::ProbeContext};

use crate::entry::{arg, save};

#[uprobe]
pub fn cuda_regs(ctx: ProbeContext) -> u32 {
    try_cuda_regs(&ctx);
    0
}

#[inline(always)]
fn try_cuda_regs(ctx: &ProbeContext) {
    save(
        ctx,
        [
            arg(ctx, 0),
            arg(ctx, 1),
            arg(ctx, 2),
            arg(ctx, 3),
            arg(ctx, 4),
            arg(ctx, 5),
        ],
    );
}
