//! The stand-in workload (`cuda-workload`), with typed options: which scenario, which library,
//! which simulated device, under which name.
use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
};

use serde_json::Value;

use crate::{env::Env, guards::TempDir};

/// What the workload does (see tests/standin/workload.c).
#[derive(Clone, Debug)]
pub enum Scenario {
    /// Launches and copies split over the threads, with known arguments.
    Basic {
        /// Kernel launches.
        launches: u64,
        /// Copies.
        copies: u64,
    },
    /// Every exported entry point, `n` calls each.
    Each(u64),
    /// Launches of `grid` blocks for `seconds`, a stream wait every `sync_every`.
    Loop {
        /// How long.
        seconds: f64,
        /// Blocks per launch (device time per launch, with `CUDA_STANDIN_NS_PER_BLOCK`).
        grid: u32,
        /// Launches between two waits.
        sync_every: u64,
    },
    /// Exits while a thread is blocked inside `cuStreamSynchronize`.
    DieInCall,
    /// `cuLaunchKernelEx` calls whose `CUlaunchConfig` is in a file mapping not yet paged in.
    UnpagedConfig(u64),
    /// Host-to-device copies of 2^63 bytes, each refused by the library.
    HugeCopies(u64),
    /// `cuLaunchKernel` calls back to back, timed (benchmarks).
    Calls(u64),
    /// N timed 64-byte `cuMemcpyHtoD_v2` calls (one record each, also when launches are counted
    /// in the kernel).
    CopyCalls(u64),
    /// `Loop { seconds, grid: 1, sync_every: 1 }` in a second thread, after `main` calls
    /// `pthread_exit`.
    Headless(f64),
    /// N launches, a rename of the process to NAME (`prctl(PR_SET_NAME)`), N more launches.
    Rename(String, u64),
    /// A kernel looked up by this name (any bytes a tenant chooses), launched once.
    Lookup(String),
    /// Each of these kernels looked up, then launched (`WORKLOAD_LAUNCHES` times each, after
    /// `WORKLOAD_LAUNCH_AFTER_MS`).
    LookupEach(Vec<String>),
    /// `launches` launches, each of its own made-up kernel handle, then `hold_s` seconds alive
    /// without a call.
    Handles {
        /// Launches (and distinct handles).
        launches: u64,
        /// Seconds idle afterwards.
        hold_s: f64,
    },
    /// `lookups` kernel lookups of distinct 254-byte names, then `hold_s` seconds alive without
    /// a call (with `CUDA_STANDIN_FRESH_HANDLES=1`, a new handle each).
    Lookups {
        /// Lookups (and distinct names).
        lookups: u64,
        /// Seconds idle afterwards.
        hold_s: f64,
    },
    /// `n` allocations of `bytes` each (going on past failures), then `hold_s` seconds idle.
    Allocs {
        /// Bytes per allocation.
        bytes: u64,
        /// Allocations.
        n: u64,
        /// Seconds idle afterwards, holding them.
        hold_s: f64,
    },
    /// A leak: an allocation of `bytes` every `every_ms` for `seconds`, none freed.
    Grow {
        /// Bytes per allocation.
        bytes: u64,
        /// Milliseconds between allocations.
        every_ms: u64,
        /// How long.
        seconds: f64,
    },
    /// A scenario by name with numeric arguments: the serving-stack ones of
    /// `workload_serving.c` (`graph`, `evented`, `join`, `copysync`), `crowd`...
    Named(&'static str, Vec<u64>),
    /// `polled ITERS LAUNCHES GRID HOW`, `HOW` being `event` or `stream`.
    Polled(u64, u64, u64, &'static str),
    /// Synchronous host-to-device copies of `bytes`, `gap_us` apart, for `seconds`.
    Copies {
        /// How long.
        seconds: f64,
        /// Bytes per copy.
        bytes: u64,
        /// Pause between copies, µs.
        gap_us: u64,
    },
}

impl Scenario {
    fn args(&self) -> Vec<String> {
        match self {
            Scenario::Basic { launches, copies } => {
                vec!["basic".into(), launches.to_string(), copies.to_string()]
            }
            Scenario::Each(n) => vec!["each".into(), n.to_string()],
            Scenario::Named(name, args) => std::iter::once((*name).to_owned())
                .chain(args.iter().map(u64::to_string))
                .collect(),
            Scenario::Polled(iters, launches, grid, how) => vec![
                "polled".into(),
                iters.to_string(),
                launches.to_string(),
                grid.to_string(),
                (*how).to_owned(),
            ],
            Scenario::Loop {
                seconds,
                grid,
                sync_every,
            } => {
                vec![
                    "loop".into(),
                    seconds.to_string(),
                    grid.to_string(),
                    sync_every.to_string(),
                ]
            }
            Scenario::DieInCall => vec!["die-in-call".into()],
            Scenario::UnpagedConfig(n) => vec!["unpaged-config".into(), n.to_string()],
            Scenario::HugeCopies(n) => vec!["huge-copies".into(), n.to_string()],
            Scenario::Calls(n) => vec!["calls".into(), n.to_string()],
            Scenario::CopyCalls(n) => vec!["copy-calls".into(), n.to_string()],
            Scenario::Headless(seconds) => vec!["headless".into(), seconds.to_string()],
            Scenario::Lookup(name) => vec!["lookup".into(), name.clone()],
            Scenario::LookupEach(names) => std::iter::once("lookup".to_owned())
                .chain(names.iter().cloned())
                .collect(),
            Scenario::Rename(name, n) => vec!["rename".into(), name.clone(), n.to_string()],
            Scenario::Handles { launches, hold_s } => {
                vec!["handles".into(), launches.to_string(), hold_s.to_string()]
            }
            Scenario::Lookups { lookups, hold_s } => {
                vec!["lookups".into(), lookups.to_string(), hold_s.to_string()]
            }
            Scenario::Grow {
                bytes,
                every_ms,
                seconds,
            } => vec![
                "grow".into(),
                bytes.to_string(),
                every_ms.to_string(),
                seconds.to_string(),
            ],
            Scenario::Allocs { bytes, n, hold_s } => vec![
                "allocs".into(),
                bytes.to_string(),
                n.to_string(),
                hold_s.to_string(),
            ],
            Scenario::Copies {
                seconds,
                bytes,
                gap_us,
            } => {
                vec![
                    "copies".into(),
                    seconds.to_string(),
                    bytes.to_string(),
                    gap_us.to_string(),
                ]
            }
        }
    }
}

/// A workload to run: scenario, library, environment, name.
pub struct Workload {
    exe: PathBuf,
    lib: PathBuf,
    scenario: Scenario,
    settle_ms: Option<u64>,
    threads: Option<u32>,
    uid: Option<u32>,
    vars: Vec<(String, String)>,
    comm: Option<String>,
    cgroup: Option<PathBuf>,
    exit_code: Option<i32>,
    hold: bool,
    loader: Option<PathBuf>,
}

impl Workload {
    /// `scenario` against the stand-in libcuda.
    pub fn new(env: &Env, scenario: Scenario) -> Workload {
        Workload {
            exe: env.workload(),
            lib: env.libcuda(),
            scenario,
            settle_ms: None,
            loader: None,
            threads: None,
            uid: None,
            vars: Vec::new(),
            comm: None,
            exit_code: None,
            cgroup: None,
            hold: false,
        }
    }

    /// Loads this library instead.
    pub fn lib(mut self, lib: impl Into<PathBuf>) -> Workload {
        self.lib = lib.into();
        self
    }

    /// Runs on this simulated device file (`CUDA_STANDIN_DEVICE`).
    pub fn device(self, file: &str) -> Workload {
        self.var("CUDA_STANDIN_DEVICE", file)
    }

    /// Sets an environment variable.
    pub fn var(mut self, key: &str, value: &str) -> Workload {
        self.vars.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Sets environment variables.
    pub fn vars(mut self, vars: &[(&str, &str)]) -> Workload {
        self.vars
            .extend(vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        self
    }

    /// Waits this long between loading the library and the first call.
    pub fn settle_ms(mut self, ms: u64) -> Workload {
        self.settle_ms = Some(ms);
        self
    }

    /// Splits the work over this many threads (`basic`).
    pub fn threads(mut self, n: u32) -> Workload {
        self.threads = Some(n);
        self
    }

    /// Runs as this user (and group), with no capabilities, through setpriv.
    pub fn as_user(mut self, uid: u32) -> Workload {
        self.uid = Some(uid);
        self
    }

    /// Exits with `code` once its scenario is done.
    pub fn exit_code(mut self, code: i32) -> Workload {
        self.exit_code = Some(code);
        self
    }

    /// Runs under another name (its comm), through a symlink.
    pub fn comm(mut self, name: &str) -> Workload {
        self.comm = Some(name.to_owned());
        self
    }

    /// Loads the library, then waits until [`Running::release_and_wait`] before its first call.
    pub fn hold(mut self) -> Workload {
        self.hold = true;
        self
    }

    /// Starts it in this cgroup v2 directory (a shell writes its pid, then execs it).
    pub fn cgroup(mut self, dir: &std::path::Path) -> Workload {
        self.cgroup = Some(dir.to_path_buf());
        self
    }

    /// Starts it without waiting.
    pub fn spawn(self) -> Running {
        let (exe, link_dir) = match &self.comm {
            Some(name) => {
                let dir = TempDir::new("names");
                let link = dir.join(name);
                std::os::unix::fs::symlink(&self.exe, &link).unwrap();
                (link, Some(dir))
            }
            None => (self.exe.clone(), None),
        };
        // What runs, in order: the cgroup's shell, setpriv, the workload.
        let mut argv: Vec<std::ffi::OsString> = Vec::new();
        if let Some(dir) = &self.cgroup {
            argv.extend([
                "sh".into(),
                "-c".into(),
                "echo $$ > \"$0\" && exec \"$@\"".into(),
            ]);
            argv.push(dir.join("cgroup.procs").into());
        }
        if let Some(uid) = self.uid {
            argv.push("setpriv".into());
            argv.extend([
                format!("--reuid={uid}").into(),
                format!("--regid={uid}").into(),
                "--clear-groups".into(),
                "--inh-caps=-all".into(),
            ]);
        }
        if let Some(loader) = &self.loader {
            argv.push(loader.into());
        }
        argv.push(exe.into());
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        cmd.arg("--lib").arg(&self.lib);
        if let Some(n) = self.threads {
            cmd.args(["--threads", &n.to_string()]);
        }
        if let Some(ms) = self.settle_ms {
            cmd.args(["--settle", &ms.to_string()]);
        }
        if let Some(code) = self.exit_code {
            cmd.args(["--exit", &code.to_string()]);
        }
        if self.hold {
            cmd.arg("--hold").stdin(Stdio::piped());
        }
        let child = cmd
            .args(self.scenario.args())
            .envs(self.vars.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .spawn()
            .expect("cannot run cuda-workload");
        Running {
            child: Some(child),
            _link_dir: link_dir,
        }
    }

    /// Runs it through the dynamic loader `loader` (`LOADER PROGRAM ARGS...`: the loader is the
    /// executed file, and the one the process maps).
    pub fn through_loader(mut self, loader: &std::path::Path) -> Workload {
        self.loader = Some(loader.to_owned());
        self
    }

    /// Runs it to completion; returns its JSON report.
    pub fn run(self) -> Value {
        self.spawn().finish()
    }
}

/// A started workload; killed if dropped before it finished (a failed assertion).
pub struct Running {
    child: Option<Child>,
    _link_dir: Option<TempDir>,
}

impl Running {
    /// Its pid.
    pub fn pid(&self) -> u64 {
        u64::from(self.child.as_ref().expect("running").id())
    }

    /// Waits for it; returns its JSON report (the last line it printed).
    pub fn finish(mut self) -> Value {
        report(self.child.take().expect("running"))
    }

    /// Lets a held workload go on (closes its stdin), waits for it; returns its JSON report.
    pub fn release_and_wait(mut self) -> Value {
        let mut child = self.child.take().expect("running");
        drop(child.stdin.take());
        report(child)
    }

    /// Waits for it, whatever its status; returns the status.
    pub fn status(mut self) -> std::process::ExitStatus {
        self.child.take().expect("running").wait().unwrap()
    }

    /// Kills it (SIGKILL) and waits; returns the status.
    pub fn kill(mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let _ = child.kill();
        child.wait().unwrap()
    }

    /// Whether it has exited.
    pub fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| c.try_wait().ok().flatten().is_some())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits for a child that prints the workload's report (the workload itself, or a script that
/// execs it) and returns the report.
pub fn report(child: Child) -> Value {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "workload failed: {}", out.status);
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().last().expect("workload printed nothing"))
        .expect("workload JSON")
}
