//! What cudatrace reads from the kernel's BTF (`/sys/kernel/btf/vmlinux`): where `exit_code`
//! sits in `struct task_struct`, so that the exit program can report a process's exit status,
//! and where discovery's exec hook finds an executed file's device and inode (kernels that
//! refuse the BTF-typed programs that would read them by name need the offsets). A walk over
//! the type section, bounded; aya 0.14 keeps its BTF types' members private.
use std::io::Read as _;

/// The kernel's BTF.
const VMLINUX: &str = "/sys/kernel/btf/vmlinux";
/// Larger than any kernel's BTF (a few MiB): more is not read.
const MAX_BYTES: u64 = 64 << 20;
const MAGIC: u16 = 0xeb9f;

/// The byte offset of `exit_code` in the running kernel's `struct task_struct`, or None when the
/// kernel has no BTF or it does not say.
pub fn exit_code_offset() -> Option<u32> {
    member_offset(&vmlinux()?, "task_struct", "exit_code")
}

/// Where the exec hook finds an executed file's device and inode: `linux_binprm.file`,
/// `file.f_inode`, `inode.i_ino`, `inode.i_sb` and `super_block.s_dev`, in that order (the
/// `EXEC_*` slots); None unless the kernel's BTF says each.
pub fn exec_offsets() -> Option<[u32; 5]> {
    let data = vmlinux()?;
    Some([
        member_offset(&data, "linux_binprm", "file")?,
        member_offset(&data, "file", "f_inode")?,
        member_offset(&data, "inode", "i_ino")?,
        member_offset(&data, "inode", "i_sb")?,
        member_offset(&data, "super_block", "s_dev")?,
    ])
}

/// The running kernel's BTF, at most [`MAX_BYTES`].
fn vmlinux() -> Option<Vec<u8>> {
    let mut data = Vec::new();
    std::fs::File::open(VMLINUX)
        .ok()?
        .take(MAX_BYTES)
        .read_to_end(&mut data)
        .ok()?;
    Some(data)
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        data.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// The byte offset of `member` in the struct `name`, from a little-endian BTF blob (None for a
/// bitfield, a member not found or a blob that does not parse).
pub fn member_offset(data: &[u8], name: &str, member: &str) -> Option<u32> {
    if data.len() < 24 || u16::from_le_bytes([data[0], data[1]]) != MAGIC {
        return None;
    }
    let hdr_len = u32_at(data, 4)? as usize;
    let (type_off, type_len) = (u32_at(data, 8)? as usize, u32_at(data, 12)? as usize);
    let (str_off, str_len) = (u32_at(data, 16)? as usize, u32_at(data, 20)? as usize);
    let types = data.get(hdr_len + type_off..hdr_len + type_off + type_len)?;
    let strings = data.get(hdr_len + str_off..hdr_len + str_off + str_len)?;
    let string = |off: u32| -> Option<&[u8]> {
        let rest = strings.get(off as usize..)?;
        Some(&rest[..rest.iter().position(|b| *b == 0)?])
    };
    let mut at = 0usize;
    while at + 12 <= types.len() {
        let (name_off, info) = (u32_at(types, at)?, u32_at(types, at + 4)?);
        let (kind, vlen, kind_flag) = ((info >> 24) & 0x1f, (info & 0xffff) as usize, info >> 31);
        at += 12;
        let extra = match kind {
            1 | 14 | 17 => 4,             // INT, VAR, DECL_TAG
            3 => 12,                      // ARRAY
            4 | 5 | 15 | 19 => 12 * vlen, // STRUCT, UNION, DATASEC, ENUM64
            6 | 13 => 8 * vlen,           // ENUM, FUNC_PROTO
            2 | 7..=12 | 16 | 18 => 0,    // PTR, FWD .. FUNC, FLOAT, TYPE_TAG
            _ => return None,             // a kind this walk does not know
        };
        if kind == 4 && string(name_off)? == name.as_bytes() {
            for m in 0..vlen {
                let base = at + 12 * m;
                if string(u32_at(types, base)?)? == member.as_bytes() {
                    let offset = u32_at(types, base + 8)?;
                    let bits = if kind_flag == 1 {
                        offset & 0xff_ffff
                    } else {
                        offset
                    };
                    let bitfield = kind_flag == 1 && offset >> 24 != 0;
                    return (!bitfield && bits % 8 == 0).then_some(bits / 8);
                }
            }
            return None;
        }
        at += extra;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob of an INT and `struct task_struct { int pid; int exit_code; }`.
    fn blob(exit_code_bits: u32) -> Vec<u8> {
        let strings = b"\0int\0task_struct\0pid\0exit_code\0";
        let mut types = Vec::new();
        let mut put = |v: u32| types.extend_from_slice(&v.to_le_bytes());
        // [1] INT "int", 4 bytes, then its encoding word.
        put(1);
        put(1 << 24);
        put(4);
        put(32);
        // [2] STRUCT "task_struct", 2 members, 4096 bytes.
        put(5);
        put(4 << 24 | 2);
        put(4096);
        put(17); // "pid"
        put(1);
        put(0);
        put(21); // "exit_code"
        put(1);
        put(exit_code_bits);
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&[1, 0]);
        for v in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&types);
        out.extend_from_slice(strings);
        out
    }

    #[test]
    fn finds_the_member_and_refuses_garbage() {
        assert_eq!(
            member_offset(&blob(2432 * 8), "task_struct", "exit_code"),
            Some(2432)
        );
        assert_eq!(member_offset(&blob(0), "task_struct", "pid"), Some(0));
        assert_eq!(member_offset(&blob(8), "task_struct", "nope"), None);
        assert_eq!(member_offset(&blob(8), "mm_struct", "exit_code"), None);
        let mut cut = blob(8);
        cut.truncate(40);
        assert_eq!(member_offset(&cut, "task_struct", "exit_code"), None);
        assert_eq!(member_offset(&[0xff; 64], "task_struct", "exit_code"), None);
    }

    #[test]
    fn the_running_kernel_says_where_exit_code_is() {
        // Every kernel this runs on in CI has BTF (uprobe_multi needs 6.6).
        let off = exit_code_offset().expect("exit_code in /sys/kernel/btf/vmlinux");
        assert!(off > 0 && off < 16384, "{off}");
        let exec = exec_offsets().expect("the exec hook's members in /sys/kernel/btf/vmlinux");
        assert!(exec.iter().all(|o| *o < 4096), "{exec:?}");
        // The device and the inode's superblock are distinct members of their structs.
        assert_ne!(exec[2], exec[3], "{exec:?}");
    }
}
