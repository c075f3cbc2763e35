//! A thread's name as the kernel keeps it.
use serde::Serialize;

/// A thread name (at most 15 bytes, as the kernel keeps it), held inline: decoding one costs no
/// allocation, which matters at hundreds of thousands of events a second.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Comm {
    bytes: [u8; 16],
    len: u8,
}

impl Comm {
    /// From the kernel's NUL-padded bytes; invalid UTF-8 is replaced as `from_utf8_lossy` would.
    pub fn from_raw(raw: &[u8; 16]) -> Comm {
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        match std::str::from_utf8(&raw[..end]) {
            Ok(_) => {
                let mut bytes = [0u8; 16];
                bytes[..end].copy_from_slice(&raw[..end]);
                Comm {
                    bytes,
                    len: end as u8,
                }
            }
            Err(_) => Comm::from(String::from_utf8_lossy(&raw[..end]).as_ref()),
        }
    }
}

impl std::ops::Deref for Comm {
    type Target = str;
    fn deref(&self) -> &str {
        // Only valid UTF-8 is stored (both constructors check or truncate at a char boundary).
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl From<&str> for Comm {
    /// Keeps at most 16 bytes, cut at a character boundary.
    fn from(s: &str) -> Comm {
        let mut end = s.len().min(16);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        let mut bytes = [0u8; 16];
        bytes[..end].copy_from_slice(&s.as_bytes()[..end]);
        Comm {
            bytes,
            len: end as u8,
        }
    }
}

impl From<String> for Comm {
    fn from(s: String) -> Comm {
        Comm::from(s.as_str())
    }
}

impl PartialEq<&str> for Comm {
    fn eq(&self, other: &&str) -> bool {
        **self == **other
    }
}

impl std::fmt::Display for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self)
    }
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

impl Serialize for Comm {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self)
    }
}
