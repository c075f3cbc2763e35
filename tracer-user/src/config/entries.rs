//! Checks shared by the config's named lists (`[[detect.schedule]]`, `[[alerts.quiet]]`).

use super::ConfigError;

/// Entries a policy list takes at most.
pub const MAX_ENTRIES: usize = 64;
/// Longest entry name.
pub const MAX_NAME: usize = 64;

/// Checks a policy list: at most [`MAX_ENTRIES`], each name given, bounded, printable and not
/// taken by an earlier entry; the error is the whole line.
pub fn check<'a>(
    list: &str,
    names: impl ExactSizeIterator<Item = &'a str>,
) -> Result<(), ConfigError> {
    if names.len() > MAX_ENTRIES {
        return Err(ConfigError::invalid(
            list,
            format!(
                "{list}: {} entries: give at most {MAX_ENTRIES}",
                names.len()
            ),
        ));
    }
    let mut earlier: Vec<&str> = Vec::new();
    for name in names {
        check_name(list, name, &earlier).map_err(|why| ConfigError::invalid(list, why))?;
        earlier.push(name);
    }
    Ok(())
}

/// Checks an entry's name (given, bounded, printable, not taken); the error is the whole line.
fn check_name(list: &str, name: &str, earlier: &[&str]) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("{list}: give every entry a name"));
    }
    if name.len() > MAX_NAME || name.chars().any(char::is_control) {
        return Err(format!(
            "{list}: name {:?}: give at most {MAX_NAME} printable characters",
            name.chars().take(MAX_NAME).collect::<String>()
        ));
    }
    if earlier.contains(&name) {
        return Err(format!(
            "{list} {name:?}: the name is taken by an earlier entry"
        ));
    }
    Ok(())
}
