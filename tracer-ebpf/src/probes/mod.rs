//! The hooks, one file per family: an entry program per argument layout (`launch`, `launch_ex`,
//! `registers`, which reads the copies whose sizes sit in memory through `params`), the one return program (`ret`), the uprobe-session programs of the launch families (`session`), the process-exit hook (`exit`) and the
//! process-rename hook (`rename`), the hooks of discovery (`opened_path` on the kernel's open path; where that cannot attach, `loaded` in each dynamic loader with `exec` to find new loaders, else `opened` on `sys_enter`), the fault hook of the harm check (`fault`), and the count-only entry
//! program of `cudatrace census` (`census`). Each hook is a thin wrapper over a `try_*` function that does
//! the work.
pub mod census;
pub mod exec;
pub mod exit;
pub mod fault;
pub mod launch;
pub mod launch_ex;
pub mod loaded;
pub mod opened;
pub mod opened_path;
pub mod params;
pub mod registers;
pub mod rename;
pub mod ret;
pub mod session;
