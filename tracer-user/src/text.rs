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

/// Tenant text made inert where a chat tool reads markup: `<`, `>`, `@` and `&` written as
/// look-alikes (`‹`, `›`, `＠`, `＆`), so that a process named `<!channel>` or `@here` pings
/// nobody when an alert's summary reaches Slack; control characters escaped as [`printable`].
pub fn defang(s: &str) -> Cow<'_, str> {
    let s = printable(s);
    if !s.contains(['<', '>', '@', '&']) {
        return s;
    }
    Cow::Owned(
        s.chars()
            .map(|c| match c {
                '<' => '‹',
                '>' => '›',
                '@' => '＠',
                '&' => '＆',
                c => c,
            })
            .collect(),
    )
}

/// Tenant text as one field of a `pid:comm,pid:comm` list: `\`, `,` and `:` escaped with a
/// backslash (a process named `x,4242:llm-srv` cannot add an entry), then [`defang`]ed.
pub fn list_field(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in defang(s).chars() {
        if matches!(c, '\\' | ',' | ':') {
            out.push('\\');
        }
        out.push(c);
    }
    out
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

    #[test]
    fn list_fields_cannot_add_entries_and_mentions_ping_nobody() {
        assert_eq!(list_field("x,4242:llm-srv"), "x\\,4242\\:llm-srv");
        assert_eq!(list_field("a\\,b"), "a\\\\\\,b");
        assert_eq!(defang("<!channel> @here &lt;"), "‹!channel› ＠here ＆lt;");
        assert_eq!(defang("trainer"), "trainer");
        assert_eq!(defang("\u{1b}[31m<x>"), "\\u{1b}[31m‹x›");
    }
}
