//! Text helpers every stage uses, with no imports from the stages: names and paths made safe to
//! print, and wall-clock times as RFC 3339.
use std::{borrow::Cow, time::SystemTime};

/// Whether `c` would change or hide what a reader sees: control characters (terminal escapes
/// included), bidirectional overrides and isolates (a comm that reads backwards), and
/// zero-width or invisible formatting characters (two names that look the same).
pub fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{FEFF}'
        )
}

/// `s` with every [`hidden`] character (terminal escapes, bidi overrides, zero-width ones)
/// written as `\u{..}`: names and paths come from tenants, and are shown on terminals, pages
/// and chat tools.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(hidden) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .map(|c| {
                if hidden(c) {
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
    fn bidi_overrides_and_zero_width_characters_are_escaped() {
        // "llm-srv" written backwards behind a right-to-left override, and a zero-width space
        // that makes a second "trainer" look like the first.
        assert_eq!(printable("x\u{202E}vrs-mll"), "x\\u{202e}vrs-mll");
        assert_eq!(printable("tra\u{200B}iner"), "tra\\u{200b}iner");
        assert_eq!(printable("\u{2066}a\u{2069}"), "\\u{2066}a\\u{2069}");
        assert_eq!(printable("\u{FEFF}bom"), "\\u{feff}bom");
        // Letters of other scripts stay as they are.
        assert_eq!(printable("модель-東京"), "модель-東京");
        assert!(matches!(printable("модель"), Cow::Borrowed(_)));
    }

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
