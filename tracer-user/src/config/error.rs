//! What is wrong with a config file, as callers branch on it.
use std::path::PathBuf;

/// A config file that cannot be used; each displays as the one line the user reads.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("bad config {}: cannot read it ({why})", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        why: std::io::Error,
    },
    /// Not TOML, an unknown key or a value of the wrong type.
    #[error("{0}")]
    Syntax(String),
    /// A key's value is out of its range, or disagrees with another's.
    #[error("{message}")]
    Invalid {
        /// The key at fault, as the file spells it (`detect.window_s`, `alerts.quiet`).
        key: String,
        /// The whole line: the key, its value and what to give instead.
        message: String,
    },
    /// One of the above, in a file.
    #[error("bad config {}: {error}", path.display())]
    In {
        /// The file.
        path: PathBuf,
        /// What is wrong in it.
        error: Box<ConfigError>,
    },
}

impl ConfigError {
    /// `key`'s value is wrong, as `message` says.
    pub fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            key: key.into(),
            message: message.into(),
        }
    }

    /// The key at fault, where one is (in a file or not).
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { key, .. } => Some(key),
            ConfigError::In { error, .. } => error.key(),
            ConfigError::Read { .. } | ConfigError::Syntax(_) => None,
        }
    }
}
