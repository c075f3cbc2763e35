//! `cargo xtask vm-test --arch aarch64`: cudatrace proved in a kernel of another architecture.
//! It cross-builds cudatrace, the stand-ins and `bpf-objects`, fetches Debian's kernel and a
//! static busybox for that architecture (`apt-get download`, cached under target/vm/ARCH),
//! packs them with the libraries they load into an initramfs whose /init is `init.sh`, boots it
//! in qemu (TCG: no KVM needed), and checks what the guest printed (`checks`).
mod checks;
mod harm;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{
    cross::{self, Arch},
    root, run, target_dir,
};

/// Calls of each entry point by `cuda-workload each` under `trace`.
pub const EACH: u64 = 20;
/// Launches of `cuda-workload --threads 2 basic` under `trace` (both threads together).
pub const LAUNCHES: u64 = 2000;
/// Copies of the same workload.
pub const COPIES: u64 = 200;
/// Launches of the workload that `run` discovers by its dlopen.
pub const RUN_LAUNCHES: u64 = 5000;
/// The guest's limit: it is killed past this.
const LIMIT: Duration = Duration::from_secs(540);

/// The qemu machine for an architecture: program, machine, console device.
fn qemu(arch: Arch) -> Result<(&'static str, &'static str, &'static str)> {
    match arch {
        Arch::Aarch64 => Ok(("qemu-system-aarch64", "virt", "ttyAMA0")),
        Arch::X86_64 => {
            bail!("vm-test is for another architecture than this host's: use --arch aarch64")
        }
    }
}

/// Downloads Debian package `name` for `arch` into `dir` (once); returns the .deb's path.
fn download(dir: &Path, name: &str, arch: Arch) -> Result<PathBuf> {
    let find = || -> Option<PathBuf> {
        std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{name}_")) && n.ends_with(".deb"))
            })
    };
    if let Some(p) = find() {
        return Ok(p);
    }
    let out = Command::new("apt-get")
        .current_dir(dir)
        .args(["-o", "APT::Sandbox::User=root", "download", "-q"])
        .arg(format!("{name}:{}", arch.debian()))
        .output()
        .context("apt-get (Debian) is needed to fetch the guest's kernel")?;
    if !out.status.success() {
        bail!(
            "cannot download {name}:{a} ({}): add the architecture with `dpkg --add-architecture {a} && \
             apt-get update` (scripts/setup.sh does), then run again",
            String::from_utf8_lossy(&out.stderr).trim(),
            a = arch.debian()
        );
    }
    find().with_context(|| format!("apt-get download {name} left no .deb in {}", dir.display()))
}

/// The guests' kernels: Debian's own arm64 kernel (6.1: classic uprobes), and bookworm-security's
/// 6.12 (uprobe_multi links): `(label, meta-package, cache folder, uprobe_multi expected)`.
const KERNELS: [(&str, &str, &str, bool); 2] = [
    ("6.1", "linux-image-arm64", "kernel", false),
    ("6.12", "linux-image-6.12-arm64", "kernel-6.12", true),
];

/// The kernel image of Debian's meta-package `meta` (the package it depends on), extracted
/// under `cache`/`dir`.
fn kernel(cache: &Path, arch: Arch, meta: &str, dir: &str) -> Result<PathBuf> {
    let meta = download(cache, meta, arch)?;
    let depends = String::from_utf8(
        Command::new("dpkg-deb")
            .args(["-f"])
            .arg(&meta)
            .arg("Depends")
            .output()?
            .stdout,
    )?;
    let real = depends
        .split([' ', ','])
        .next()
        .context("linux-image depends on its kernel")?;
    let deb = download(cache, real, arch)?;
    let dir = cache.join(dir);
    if !dir.join("boot").exists() {
        std::fs::create_dir_all(&dir)?;
        run(Command::new("sh").arg("-c").arg(format!(
            "dpkg-deb --fsys-tarfile '{}' | tar -x -C '{}' ./boot",
            deb.display(),
            dir.display()
        )))?;
    }
    std::fs::read_dir(dir.join("boot"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .context("the kernel package holds no /boot/vmlinuz-*")
}

/// The static busybox of Debian's `busybox-static`, extracted.
fn busybox(cache: &Path, arch: Arch) -> Result<PathBuf> {
    let deb = download(cache, "busybox-static", arch)?;
    let dir = cache.join("busybox");
    if !dir.join("bin/busybox").exists() {
        std::fs::create_dir_all(&dir)?;
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&dir))?;
    }
    Ok(dir.join("bin/busybox"))
}

/// Builds the initramfs (an uncompressed newc cpio) from the built files; returns its path.
fn initramfs(cache: &Path, arch: Arch, standin: &Path) -> Result<PathBuf> {
    let rootfs = cache.join("rootfs");
    let _ = std::fs::remove_dir_all(&rootfs);
    for d in [
        "bin", "usr/bin", "etc", "proc", "sys", "dev", "tmp", "opt/cuda",
    ] {
        std::fs::create_dir_all(rootfs.join(d))?;
    }
    let libdir = rootfs.join("usr/lib").join(arch.gnu());
    std::fs::create_dir_all(&libdir)?;
    std::fs::copy(busybox(cache, arch)?, rootfs.join("bin/busybox"))?;
    let bpf_objects = standin.join("bpf-objects");
    run(Command::new(arch.cc())
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&bpf_objects)
        .arg(root().join("tests/vm/bpf-objects.c")))?;
    let bins = [
        (arch.binary(), "usr/bin/cudatrace"),
        (standin.join("cuda-workload"), "usr/bin/cuda-workload"),
        (bpf_objects, "usr/bin/bpf-objects"),
    ];
    for (from, to) in &bins {
        std::fs::copy(from, rootfs.join(to))
            .with_context(|| format!("cannot copy {}", from.display()))?;
    }
    // The stand-in where the loader (and cudatrace's start-up scan) finds it, and another
    // build, with branch protection (`bti c` first in each function), that only a dlopen reveals.
    std::fs::copy(standin.join("libcuda.so.1"), libdir.join("libcuda.so.1"))?;
    std::fs::copy(
        standin.join("libcuda-bti.so.1"),
        rootfs.join("opt/cuda/libcuda.so.1"),
    )?;
    let bins: Vec<PathBuf> = bins.iter().map(|(_, to)| rootfs.join(to)).collect();
    cross::copy_libraries(arch, &bins, &rootfs)?;
    let init = rootfs.join("init");
    std::fs::write(&init, include_str!("init.sh"))?;
    std::fs::write(
        rootfs.join("etc/vm-test.env"),
        format!("EACH={EACH}\nLAUNCHES={LAUNCHES}\nCOPIES={COPIES}\nRUN_LAUNCHES={RUN_LAUNCHES}\n"),
    )?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755))?;
    let image = cache.join("initramfs.cpio");
    run(Command::new("sh")
        .current_dir(&rootfs)
        .arg("-c")
        .arg(format!(
            "find . | cpio --quiet -o -H newc > '{}'",
            image.display()
        )))?;
    Ok(image)
}

/// How many of the probed entry points of `lib` begin with a branch-protection landing pad,
/// `bti c` or `paciasp` (which is one too, so gcc puts no `bti c` before it), read with the
/// cross objdump that comes with Debian's cross gcc; and which are `paciasp`.
fn branch_protected(arch: Arch, lib: &Path) -> Result<(usize, usize)> {
    let first: std::collections::BTreeMap<String, String> = harm::first_instructions(arch, lib)?
        .into_iter()
        .map(|(_, name, insn)| (name, insn))
        .collect();
    let starting = |what: &str| {
        tracer_common::Api::ALL
            .iter()
            .filter(|a| {
                first
                    .get(a.info().symbol)
                    .is_some_and(|i| i.starts_with(what))
            })
            .count()
    };
    Ok((starting("bti c") + starting("paciasp"), starting("paciasp")))
}

/// Boots `kernel` with `initrd` and returns what the console printed (the guest powers off at
/// the end; it is killed past [`LIMIT`]).
fn boot(arch: Arch, kernel: &Path, initrd: &Path, log: &Path, nmi: bool) -> Result<String> {
    let (program, machine, console) = qemu(arch)?;
    // Pseudo-NMIs need a GICv3 and the kernel's command line asking for them.
    let (machine, extra) = if nmi {
        (
            format!("{machine},gic-version=3"),
            " irqchip.gicv3_pseudo_nmi=1",
        )
    } else {
        (machine.to_owned(), "")
    };
    let out = std::fs::File::create(log)?;
    let mut child = Command::new(program)
        .args(["-M", &machine, "-cpu", "max", "-smp", "2", "-m", "2048"])
        .args(["-nographic", "-no-reboot", "-nic", "none", "-kernel"])
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .args([
            "-append",
            &format!("console={console} quiet panic=-1{extra}"),
        ])
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| {
            format!("{program} not found: install Debian's qemu-system-arm (scripts/setup.sh does)")
        })?;
    let began = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            if !status.success() {
                bail!("{program} failed ({status}); its output: {}", log.display());
            }
            break;
        }
        if began.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!(
                "vm-test: the guest ran past {} s and was stopped",
                LIMIT.as_secs()
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "vm-test: the guest ran {:.1} s",
        began.elapsed().as_secs_f64()
    );
    Ok(String::from_utf8_lossy(&std::fs::read(log)?).into_owned())
}

/// The whole test: build, boot, check; prints `N passed, M failed` and fails on any failure.
pub fn test(arch: Arch) -> Result<()> {
    let began = Instant::now();
    qemu(arch)?;
    let standin = cross::build(arch)?;
    let cache = target_dir().join("vm").join(arch.debian());
    std::fs::create_dir_all(&cache)?;
    let initrd = initramfs(&cache, arch, &standin)?;
    let sites = harm::objdump_sites(arch, &standin.join("libcuda.so.1"))?;
    let bti = harm::objdump_sites(arch, &standin.join("libcuda-bti.so.1"))?;
    let both = (sites.0 + bti.0, sites.1 + bti.1);
    let mut results = Vec::new();
    let mut logs = Vec::new();
    for (name, meta, dir, multi) in KERNELS {
        let kernel = kernel(&cache, arch, meta, dir)?;
        let expect = checks::Expect { multi, sites, both };
        let mut boots = vec![false];
        // On a kernel built with pseudo-NMI support, once more with them on (GICv3).
        match pseudo_nmi_config(&kernel) {
            true if multi => boots.push(true),
            true => {}
            false if multi => eprintln!(
                "vm-test: no pseudo-NMI run: {} is built without CONFIG_ARM64_PSEUDO_NMI",
                kernel.display()
            ),
            false => {}
        }
        for nmi in boots {
            let log = cache.join(format!(
                "console-{dir}{}.log",
                if nmi { "-nmi" } else { "" }
            ));
            let console = boot(arch, &kernel, &initrd, &log, nmi)?;
            let label = if nmi {
                format!("{name}+pseudo-NMI")
            } else {
                name.to_owned()
            };
            results.extend(
                checks::run(&console, &expect)
                    .into_iter()
                    .map(|(name, o)| (format!("{label}: {name}"), o)),
            );
            logs.push(log);
        }
    }
    // The copy the guest dlopened, discovered and counted exactly (checked above), is the one
    // with branch protection: say so only if its entry points really begin with a landing pad.
    let (pads, pac) = branch_protected(arch, &standin.join("libcuda-bti.so.1"))?;
    let all = tracer_common::Api::ALL.len();
    let said = format!("{pads} of {all} ({pac} paciasp, the others bti c)");
    results.push((
        "the dlopened copy is branch-protected".to_owned(),
        if pads == all { Ok(said) } else { Err(said) },
    ));
    let failed = results.iter().filter(|r| r.1.is_err()).count();
    for (name, outcome) in &results {
        match outcome {
            Ok(what) => eprintln!("vm-test: pass: {name}: {what}"),
            Err(why) => eprintln!("vm-test: FAIL: {name}: {why}"),
        }
    }
    println!(
        "vm-test ({}, {:.0} s in all; consoles: {}): {} passed, {failed} failed",
        arch.debian(),
        began.elapsed().as_secs_f64(),
        logs.iter()
            .map(|l| l.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        results.len() - failed
    );
    if failed > 0 {
        bail!("vm-test: {failed} of {} checks failed", results.len());
    }
    Ok(())
}

/// Whether the kernel next to `vmlinuz` (its `config-*` in the same folder) is built with
/// CONFIG_ARM64_PSEUDO_NMI.
fn pseudo_nmi_config(vmlinuz: &Path) -> bool {
    let Some(name) = vmlinuz.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    let config = vmlinuz.with_file_name(name.replacen("vmlinuz-", "config-", 1));
    std::fs::read_to_string(config)
        .is_ok_and(|c| c.lines().any(|l| l == "CONFIG_ARM64_PSEUDO_NMI=y"))
}
