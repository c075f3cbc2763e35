//! The stages of tracer-user import one way. Each top-level module of `tracer-user/src` has a
//! layer; a module may import (`crate::...`) only modules of lower layers. The unit test below
//! reads every source file (test modules left out) and fails on an import that goes up or
//! sideways, so a cycle cannot come back unnoticed.
#[cfg(test)]
mod tests {
    use std::{collections::BTreeSet, fs, path::Path};

    /// Bottom first. Modules in one layer do not import each other.
    const LAYERS: &[&[&str]] = &[
        // Plain data and helpers: no imports from the stages.
        &["config", "text", "bounded"],
        // How stderr lines are written; who a process is; what one decoded call is; the
        // actuator, which checks who a process is.
        &["logging", "identity"],
        &["event", "actuator"],
        // The source (probes, discovery) and the per-process tables enrichment keeps.
        &["probe", "enrich", "nvml", "hostcpu"],
        // Stages over calls: aggregation, alert records, alert policies, detection.
        &["aggregate", "alert"],
        &["policy"],
        &["detect"],
        // Every per-process table, the detector's included; then the session over it.
        &["registry"],
        &["pipeline"],
        // Where results go.
        &["sinks"],
        // What outlives the process (the detector's memory on disk); history replayed.
        &["state", "backtest"],
        // The command line and the commands, which wire source, stages and sinks.
        &["cli"],
        &["cmd"],
    ];

    fn layer(module: &str) -> Option<usize> {
        LAYERS.iter().position(|l| l.contains(&module))
    }

    /// The top-level modules `text` imports through `crate::`.
    fn imports(text: &str) -> BTreeSet<String> {
        // Test modules may reach anywhere: cut at the first `#[cfg(test)]` module.
        let text = text.find("#[cfg(test)]\nmod ").map_or(text, |i| &text[..i]);
        let mut out = BTreeSet::new();
        let mut rest = text;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // `use crate::{a::b, c::{d, e}}`: the first segment of each top-level item.
                let mut depth = 0;
                let mut item = String::new();
                for ch in group.chars() {
                    match ch {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            out.insert(first_segment(&item));
                            item.clear();
                            continue;
                        }
                        _ => {}
                    }
                    if depth == 0 {
                        item.push(ch);
                    }
                }
                out.insert(first_segment(&item));
            } else {
                out.insert(first_segment(rest));
            }
        }
        out.remove("");
        out
    }

    fn first_segment(s: &str) -> String {
        s.trim()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    }

    fn visit(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
        for entry in fs::read_dir(dir).expect("tracer-user/src is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                visit(&path, files);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }

    #[test]
    fn stages_import_one_way() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tracer-user/src");
        let mut files = Vec::new();
        visit(&src, &mut files);
        let mut wrong = Vec::new();
        let mut seen = BTreeSet::new();
        for file in &files {
            let rel = file.strip_prefix(&src).expect("under src");
            let name = rel.to_string_lossy();
            let top = name.split(['/', '.']).next().expect("a name").to_owned();
            if top == "lib" || top == "main" || name.ends_with("tests.rs") {
                continue;
            }
            let Some(own) = layer(&top) else {
                wrong.push(format!(
                    "{name}: module {top} has no layer in xtask/src/layers.rs"
                ));
                continue;
            };
            seen.insert(top.clone());
            let text = fs::read_to_string(file).expect("a source file");
            for import in imports(&text) {
                if import == top {
                    continue;
                }
                match layer(&import) {
                    Some(l) if l < own => {}
                    Some(_) => wrong.push(format!("{name}: {top} imports {import}, not below it")),
                    None => wrong.push(format!("{name}: imports {import}, which has no layer")),
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "imports against the layers:\n{}",
            wrong.join("\n")
        );
        assert!(seen.len() >= 15, "the walk found only {seen:?}");
    }

    #[test]
    fn the_reader_finds_grouped_and_inline_imports() {
        let text = "use crate::{a::B, c::{d, e}};\nfn f() { crate::g::h(); }\n#[cfg(test)]\nmod tests { use crate::z; }";
        let got: Vec<String> = imports(text).into_iter().collect();
        assert_eq!(got, ["a", "c", "g"]);
    }
}
