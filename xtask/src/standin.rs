//! One source for the probed entry points: tracer-common's table. The stand-in libcuda and the
//! workload are C, so they cannot be generated from it without a second build system; instead
//! this test reads them and fails when either disagrees with the table, in either direction.
#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use tracer_common::Api;

    /// Driver functions the stand-in exports for set-up only: not probed, never counted.
    const SETUP_ONLY: [&str; 8] = [
        "cuInit",
        "cuDeviceGet",
        "cuDeviceGetCount",
        "cuDeviceGetDefaultMemPool",
        "cuModuleLoadData",
        "cuLibraryLoadData",
        "cuEventCreate",
        "cuGraphInstantiateStandin",
    ];

    fn source(name: &str) -> String {
        let path = super::super::root().join("tests/standin").join(name);
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
    }

    /// Names of the functions `libcuda.c` (and the files it includes) exports
    /// (`EXPORT CUresult cuName(`).
    fn exported() -> BTreeSet<String> {
        (source("libcuda.c")
            + &source("libcuda_calls.c")
            + &source("libcuda_serving.c")
            + &source("libcuda_sized.c")
            + &source("libcuda_devices.c"))
            .lines()
            .filter_map(|l| l.strip_prefix("EXPORT CUresult "))
            .filter_map(|rest| rest.split('(').next())
            .map(|name| name.trim().to_owned())
            .collect()
    }

    /// Every `"cu..."` string literal in the workload's sources: the symbols it looks up with
    /// dlsym.
    fn looked_up() -> BTreeSet<String> {
        let text = source("workload.c")
            + &source("workload_each.c")
            + &source("workload_serving.c")
            + &source("workload_misc.c")
            + &source("workload_harm.c")
            + &source("workload_sized.c")
            + &source("workload_devices.c");
        text.split('"')
            .skip(1)
            .step_by(2)
            .filter(|s| {
                s.starts_with("cu")
                    && s.len() > 2
                    && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            })
            .map(str::to_owned)
            .collect()
    }

    fn table() -> BTreeSet<String> {
        Api::ALL.iter().map(|a| a.symbol().to_owned()).collect()
    }

    #[test]
    fn the_stand_in_exports_exactly_the_table_plus_its_set_up_functions() {
        let exported = exported();
        let table = table();
        let missing: Vec<_> = table.difference(&exported).collect();
        assert!(
            missing.is_empty(),
            "in tracer-common's table but not exported by tests/standin/libcuda.c: {missing:?}"
        );
        let setup: BTreeSet<String> = SETUP_ONLY.iter().map(|s| (*s).to_owned()).collect();
        let unknown: Vec<_> = exported
            .difference(&table)
            .filter(|s| !setup.contains(*s))
            .collect();
        assert!(
            unknown.is_empty(),
            "exported by tests/standin/libcuda.c but neither in tracer-common's table nor a set-up function: {unknown:?}"
        );
        assert_eq!(
            table.len(),
            115,
            "the driver-probe list's 60 entry points, the 6 of VMM, pools, managed and pitched memory, 24 memsets, 10 2-D and 3-D copies, 4 batches and 11 of contexts, UUIDs and streams"
        );
    }

    #[test]
    fn the_workload_calls_every_entry_point_of_the_table() {
        let called = looked_up();
        let missing: Vec<_> = table().difference(&called).cloned().collect();
        assert!(
            missing.is_empty(),
            "tests/standin/workload*.c never look up: {missing:?}"
        );
        let exported = exported();
        let dangling: Vec<_> = called.iter().filter(|s| !exported.contains(*s)).collect();
        assert!(
            dangling.is_empty(),
            "workload.c looks up symbols the stand-in does not export: {dangling:?}"
        );
    }
}
