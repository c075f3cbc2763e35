//! Text helpers every stage uses, with no imports from the stages: names and paths made safe to
//! print, and wall-clock times as RFC 3339.
use std::{borrow::Cow, time::SystemTime};

/// `s` with control characters (terminal escapes included) written as `\u{..}`: names and
/// paths come from tenants, and are shown on terminals.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_unicode().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// RFC 3339 with seconds, UTC.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// A process environment for tests: the value of each name in `pairs`, else none.
#[cfg(test)]
pub(crate) fn fake_env<'a>(
    pairs: &'a [(&'a str, &'a str)],
) -> impl Fn(&str) -> Option<String> + 'a {
    move |k| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(printable("python3"), "python3");
        assert_eq!(printable("evil\u{1b}[2Jname\n"), "evil\\u{1b}[2Jname\\u{a}");
    }
}
