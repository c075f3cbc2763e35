//! cudatrace's side of the actuator's socket: one connection, held while cudatrace runs (the
//! lease on every cap taken through it), reopened at the next request when it broke.
use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::Duration,
};

use super::{Reply, Request, MAX_LINE};

/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to the actuator.
pub struct Client {
    path: PathBuf,
    conn: Option<(BufReader<UnixStream>, UnixStream)>,
}

impl Client {
    /// The actuator at `path`; nothing is opened until the first request.
    pub fn new(path: &Path) -> Client {
        Client {
            path: path.to_path_buf(),
            conn: None,
        }
    }

    fn open(&self) -> std::io::Result<(BufReader<UnixStream>, UnixStream)> {
        let s = UnixStream::connect(&self.path)?;
        s.set_read_timeout(Some(TIMEOUT))?;
        s.set_write_timeout(Some(TIMEOUT))?;
        Ok((BufReader::new(s.try_clone()?), s))
    }

    fn once(&mut self, line: &[u8]) -> std::io::Result<Reply> {
        if self.conn.is_none() {
            self.conn = Some(self.open()?);
        }
        let (rd, wr) = self.conn.as_mut().expect("opened above");
        wr.write_all(line)?;
        let mut answer = String::new();
        rd.by_ref()
            .take(MAX_LINE as u64 * 4)
            .read_line(&mut answer)?;
        serde_json::from_str(&answer).map_err(std::io::Error::other)
    }

    /// Asks once (reopening a broken connection once); a failure is a refusal that says why.
    pub fn ask(&mut self, r: &Request) -> Reply {
        let mut line = serde_json::to_vec(r).unwrap_or_default();
        line.push(b'\n');
        let first = self.once(&line);
        let result = match first {
            Ok(reply) => Ok(reply),
            Err(_) => {
                self.conn = None;
                self.once(&line)
            }
        };
        result.unwrap_or_else(|e| {
            self.conn = None;
            Reply {
                ok: false,
                detail: format!(
                    "the actuator at {} did not answer: {e}",
                    self.path.display()
                ),
            }
        })
    }
}
