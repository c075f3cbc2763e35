//! The one parser of the Prometheus text exposition format the tests use.
use std::collections::BTreeMap;

/// One sample: metric name, labels, value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The metric name (with `_total`, `_bucket`... as exposed).
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

impl Sample {
    /// A label's value ("" when absent).
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

/// Parses `name{k="v",...} value` lines; comments and blank lines are skipped. Label values
/// keep their escapes undone (`\"`, `\\`, `\n`).
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let i = line.find(['{', ' '])?;
    let name = &line[..i];
    let mut labels = BTreeMap::new();
    let mut rest = &line[i..];
    if let Some(mut body) = rest.strip_prefix('{') {
        loop {
            body = body.trim_start_matches(',');
            if let Some(after) = body.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = body.find('=')?;
            let key = body[..eq].to_owned();
            let quoted = body[eq + 1..].strip_prefix('"')?;
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let end = loop {
                match chars.next()? {
                    (_, '\\') => {
                        let (_, escaped) = chars.next()?;
                        value.push(if escaped == 'n' { '\n' } else { escaped });
                    }
                    (j, '"') => break j + 1,
                    (_, c) => value.push(c),
                }
            };
            labels.insert(key, value);
            body = &quoted[end..];
        }
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// The samples of one metric whose labels include every `(key, value)` of `with`.
pub fn select<'a>(samples: &'a [Sample], name: &str, with: &[(&str, &str)]) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|s| s.name == name && with.iter().all(|(k, v)| s.label(k) == *v))
        .collect()
}

/// The sum of the samples of one metric whose labels include every `(key, value)` of `with`
/// (0 when there are none).
pub fn sum(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> f64 {
    select(samples, name, with).iter().map(|s| s.value).sum()
}

/// Polls the daemon at `listen` (up to `limit`) until the launches counted for `pid` equal
/// `want`; returns them then.
pub fn wait_for_launches(
    listen: &str,
    pid: &str,
    want: f64,
    limit: std::time::Duration,
) -> Option<f64> {
    crate::poll(limit, || {
        let samples = parse(&crate::http::scrape(listen));
        let n = sum(
            &samples,
            "cudatrace_calls_total",
            &[("pid", pid), ("api", "cuLaunchKernel")],
        );
        (n == want).then_some(n)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_values_and_escapes() {
        let text = "# HELP x y\n# TYPE a counter\na_total{pid=\"7\",kernel=\"f(int, \\\"q\\\")\"} 12\nb 0.5\n\n";
        let s = parse(text);
        assert_eq!(s.len(), 2);
        assert_eq!(
            (
                s[0].name.as_str(),
                s[0].label("pid"),
                s[0].label("kernel"),
                s[0].value
            ),
            ("a_total", "7", "f(int, \"q\")", 12.0)
        );
        assert_eq!(
            (s[1].name.as_str(), s[1].labels.len(), s[1].value),
            ("b", 0, 0.5)
        );
        assert_eq!(select(&s, "a_total", &[("pid", "7")]).len(), 1);
        assert!(select(&s, "a_total", &[("pid", "8")]).is_empty());
    }
}
