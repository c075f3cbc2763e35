//! Sets `bpf_target_arch` (the host's, or `AYA_BPF_TARGET_ARCH`), as aya-ebpf does for itself:
//! the open hook reads system call arguments from the architecture's `pt_regs`.
fn main() -> aya_build::Result<()> {
    aya_build::emit_bpf_target_arch_cfg()
}
