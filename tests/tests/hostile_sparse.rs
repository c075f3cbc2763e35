//! End-to-end: a sparse file named `libcuda.so.1` cannot crash-loop the daemon (finding 1 of the
//! third tenant review: discovery read a candidate whole, up to 2 GiB, before any check; six
//! 1 GiB sparse files in a row took the daemon to 1,064 MiB and a real job beside them had 0 of
//! 4,000 launches counted). Now the header is checked before anything else is read, and only
//! the headers and symbol tables are read, at most 16 MiB.
use std::{path::Path, process::Command, time::Duration};

use integration_tests::{
    device_file, env, exposition, free_port, guards::TempDir, vm_hwm_kib, Cudatrace, Scenario,
    Workload,
};
use object::{Object as _, ObjectSection as _};

const GIB: u64 = 1 << 30;
/// The tenants map their files by hand, which only the open path's hook sees (the loaders' hook
/// sees what the dynamic loader loads, and the loader refuses the first two kinds before
/// listing them); so the loaders are kept off and discovery hooks the open path, as on a node
/// with more loader files than the bound. Whichever hook names a file, it is read by the same
/// bounded reader.
const OPEN_HOOK: (&str, &str) = ("CUDATRACE_LOADER_SYMBOL", "no_such_symbol");

/// A copy of the stand-in whose `.dynsym` header claims 900 MiB, in a 1 GiB sparse file.
fn lying_tables(lib: &Path, to: &Path) {
    let mut data = std::fs::read(lib).unwrap();
    let (shoff, index) = {
        let elf = object::File::parse(&*data).unwrap();
        let dynsym = elf.section_by_name(".dynsym").unwrap();
        let shoff = u64::from_le_bytes(data[0x28..0x30].try_into().unwrap());
        (shoff, dynsym.index().0 as u64)
    };
    let size_at = (shoff + index * 64 + 32) as usize;
    data[size_at..size_at + 8].copy_from_slice(&(900u64 << 20).to_le_bytes());
    std::fs::write(to, &data).unwrap();
    std::fs::File::options()
        .write(true)
        .open(to)
        .unwrap()
        .set_len(GIB)
        .unwrap();
}

/// A tenant that maps 4 KiB of `file` and holds it `secs` seconds.
fn tenant(file: &Path, secs: f64) -> std::process::Child {
    Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import mmap, time\nf = open({:?}, 'rb')\nm = mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ)\ntime.sleep({secs})\n",
            file.display().to_string()
        ))
        .spawn()
        .unwrap()
}

#[test]
fn sparse_libraries_leave_the_daemon_small_and_everyone_traced() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("sparse");
    let listen = format!("127.0.0.1:{}", free_port());
    let daemon = Cudatrace::start_daemon(&env, &["--listen", &listen], &[OPEN_HOOK]);
    let dev = device_file("sparse");
    let mut job = None;
    // Six 1 GiB files in a row: zeros, an ELF header over zeros, and a copy of the library
    // whose symbol table header lies, twice each.
    let mut made = Vec::new();
    for k in 0..6 {
        let path = dir.path().join(format!("t{k}/libcuda.so.1"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        match k % 3 {
            0 => {
                std::fs::File::create(&path).unwrap().set_len(GIB).unwrap();
            }
            1 => {
                let head = std::fs::read(env.libcuda()).unwrap();
                std::fs::write(&path, &head[..64]).unwrap();
                std::fs::File::options()
                    .write(true)
                    .open(&path)
                    .unwrap()
                    .set_len(GIB)
                    .unwrap();
            }
            _ => lying_tables(&env.libcuda(), &path),
        }
        let mut t = tenant(&path, 1.0);
        assert!(t.wait().unwrap().success());
        made.push(path);
        // A real job, started in the middle of the attack and running through it.
        if k == 2 {
            let launches = Scenario::Basic {
                launches: 4000,
                copies: 0,
            };
            job = Some(
                Workload::new(&env, launches)
                    .device(&dev)
                    .settle_ms(3000)
                    .spawn(),
            );
        }
    }
    let report = job.unwrap().finish();
    let pid = report["pid"].as_u64().unwrap().to_string();
    let counted = exposition::wait_for_launches(&listen, &pid, 4000.0, Duration::from_secs(10));
    let peak_mib = vm_hwm_kib(daemon.pid()) / 1024;
    let alive = Path::new(&format!("/proc/{}", daemon.pid())).exists();
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let said = |what: &str| traced.stderr.iter().filter(|l| l.contains(what)).count();
    let (magic, short_header, tables) = (
        said("does not start with the ELF magic"),
        said("exports none of the CUDA driver entry points"),
        said("reading its symbols needs over 16777216 bytes"),
    );
    eprintln!(
        "e2e sparse_libraries_leave_the_daemon_small_and_everyone_traced: 6 sparse 1 GiB files: daemon alive {alive}, \
         peak RSS {peak_mib} MiB; refused: no ELF magic {magic}, an ELF header over zeros {short_header}, lying tables {tables}; \
         the job's launches in=4000 counted={counted:?}"
    );
    assert!(alive, "{:?}", traced.stderr);
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
    assert!(peak_mib < 64, "peak RSS {peak_mib} MiB");
    assert_eq!(counted, Some(4000.0), "{:?}", traced.stderr);
    // Each kind refused once per file, said once (the same reason is not repeated).
    assert_eq!(
        (magic, short_header, tables),
        (2, 2, 2),
        "{:?}",
        traced.stderr
    );
    assert_eq!(
        traced.log_events("attached").len(),
        1,
        "only the job's library"
    );
}
