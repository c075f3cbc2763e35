//! Who may hold the metrics port's connections. Anyone who reaches the port can connect, so one
//! client (an IPv4 address, an IPv6 /64) holds at most [`PER_CLIENT`] connections, all clients
//! together [`MAX_CONNECTIONS`], and the last [`RESERVED`] of those go only to clients holding
//! at most [`SMALL`] (a Prometheus holds one or two per target): a client that fills its share
//! leaves room for the scrapers. A connection without a byte either way for [`IDLE_TIMEOUT`]
//! (a keep-alive between scrapes, a stalled client) is closed.
use std::{
    collections::HashMap,
    net::IpAddr,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Connections one client holds at most.
pub const PER_CLIENT: usize = 64;
/// Connections open at once, at most.
pub const MAX_CONNECTIONS: usize = 4096;
/// The last connections of [`MAX_CONNECTIONS`], kept for clients holding few.
pub const RESERVED: usize = 1024;
/// Connections a client may hold and still get a reserved one.
pub const SMALL: usize = 2;
/// A connection idle this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// One client, as the limits count them: an IPv4 address, or an IPv6 /64 (what one host gets).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Client(IpAddr);

impl Client {
    /// The client of a peer address.
    pub fn of(ip: IpAddr) -> Client {
        match ip {
            IpAddr::V4(v4) => Client(IpAddr::V4(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Client(IpAddr::V4(v4)),
                None => {
                    let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                    Client(IpAddr::V6(prefix.into()))
                }
            },
        }
    }
}

/// The connections open now, by client.
#[derive(Clone, Default)]
pub struct Admission(Arc<Mutex<Open>>);

#[derive(Default)]
struct Open {
    all: usize,
    by_client: HashMap<Client, usize>,
}

/// One admitted connection; it counts until dropped.
pub struct Ticket {
    admission: Admission,
    client: Client,
}

impl Admission {
    /// A ticket for a new connection of `client`, or `None` when the limits refuse it.
    pub fn admit(&self, client: Client) -> Option<Ticket> {
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mine = open.by_client.get(&client).copied().unwrap_or(0);
        let full = open.all >= MAX_CONNECTIONS
            || mine >= PER_CLIENT
            || (open.all >= MAX_CONNECTIONS - RESERVED && mine >= SMALL);
        if full {
            return None;
        }
        open.all += 1;
        *open.by_client.entry(client).or_default() += 1;
        Some(Ticket {
            admission: self.clone(),
            client,
        })
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut open = self.admission.0.lock().unwrap_or_else(|e| e.into_inner());
        open.all -= 1;
        if let Some(n) = open.by_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                open.by_client.remove(&self.client);
            }
        }
    }
}

/// A connection's stream that notes when a byte last went either way.
pub struct Watched<S> {
    inner: S,
    last: Arc<AtomicU64>,
    born: Instant,
}

impl<S> Watched<S> {
    /// Wraps `inner`; `idle` resolves once it has been idle for [`IDLE_TIMEOUT`].
    pub fn new(inner: S) -> (Watched<S>, impl std::future::Future<Output = ()>) {
        let last = Arc::new(AtomicU64::new(0));
        let born = Instant::now();
        let seen = last.clone();
        let idle = async move {
            loop {
                let since = born.elapsed().as_millis() as u64 - seen.load(Ordering::Relaxed);
                let left = IDLE_TIMEOUT.saturating_sub(Duration::from_millis(since));
                if left.is_zero() {
                    return;
                }
                tokio::time::sleep(left).await;
            }
        };
        (Watched { inner, last, born }, idle)
    }

    fn touch(&self) {
        self.last
            .store(self.born.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.touch();
        }
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_client_cannot_take_the_scrapers_room() {
        let a = Admission::default();
        let ip = |s: &str| Client::of(s.parse().unwrap());
        let hog: Vec<Ticket> = (0..PER_CLIENT + 5)
            .filter_map(|_| a.admit(ip("10.0.0.9")))
            .collect();
        assert_eq!(hog.len(), PER_CLIENT);
        // An IPv6 /64 is one client; a v4-mapped address is its IPv4 one.
        assert_eq!(ip("2001:db8::1"), ip("2001:db8::ffff:2"));
        assert_ne!(ip("2001:db8::1"), ip("2001:db8:0:1::1"));
        assert_eq!(ip("::ffff:10.0.0.9"), ip("10.0.0.9"));
        // Many clients fill the open room; the reserve is only for clients holding few.
        let many: Vec<Ticket> = (0..2000u32)
            .flat_map(|i| {
                let c = Client::of(IpAddr::from((0x0b00_0000 + i).to_be_bytes()));
                (0..3).filter_map(|_| a.admit(c)).collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(hog.len() + many.len(), MAX_CONNECTIONS, "every slot in use");
        assert!(a.admit(ip("10.0.0.200")).is_none(), "none left at all");
        drop(many);
        let big: Vec<Ticket> = (0..100u32)
            .flat_map(|i| {
                let c = Client::of(IpAddr::from((0x0c00_0000 + i).to_be_bytes()));
                (0..PER_CLIENT)
                    .filter_map(|_| a.admit(c))
                    .collect::<Vec<_>>()
            })
            .collect();
        // 47 clients fill the open room (64 + 47 x 64 = 3,072); the other 53 get two each.
        assert_eq!(hog.len() + big.len(), MAX_CONNECTIONS - RESERVED + 2 * 53);
        assert!(a.admit(ip("10.0.0.7")).is_some(), "a scraper still gets in");
        drop((hog, big));
        assert_eq!(a.0.lock().unwrap().all, 0);
        assert!(a.0.lock().unwrap().by_client.is_empty());
    }
}
