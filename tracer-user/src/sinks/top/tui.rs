//! `top`'s interactive screen (ratatui over crossterm): the [`View`] as a table with a header
//! per GPU, sorted by any column, filtered by text, paused, and a detail pane of one process
//! (its top kernels, its alerts). The terminal is restored on every exit: the [`Screen`] guard's
//! drop, and ratatui's panic hook.
use std::{collections::VecDeque, sync::Arc};

use ratatui::{
    crossterm::event::{KeyCode, KeyEvent, KeyModifiers},
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Cell, Paragraph, Row as TableRow, Table, TableState},
    DefaultTerminal, Frame,
};

use super::{
    columns::{alert_rank, Column, COLUMNS},
    text, Row, View,
};
use crate::{alert::AlertChange, sinks::metrics::Snapshot, text::printable};

/// Alert changes remembered for the detail pane.
const RECENT_ALERTS: usize = 32;

/// The terminal and what is shown on it.
pub struct Screen {
    terminal: DefaultTerminal,
    state: State,
}

/// What the user chose, and what is shown.
struct State {
    /// Index into [`COLUMNS`] the rows sort by, and whether the biggest come first.
    sort: (usize, bool),
    /// The filter, and whether it is being typed.
    filter: (String, bool),
    paused: bool,
    table: TableState,
    /// The process whose detail pane is open.
    detail: Option<u32>,
    view: View,
    snapshot: Option<Arc<Snapshot>>,
    recent: VecDeque<AlertChange>,
    /// Wall time of the data shown (HH:MM:SS).
    clock: String,
    /// The detail pane's process's streams, one line each.
    streams: Vec<String>,
}

/// What a key asks of the loop.
#[derive(Debug, PartialEq, Eq)]
pub enum Ask {
    /// Nothing beyond a redraw.
    Redraw,
    /// Quit.
    Quit,
}

impl Screen {
    /// Takes over the terminal (alternate screen, raw mode; restored on drop and on panic).
    pub fn start() -> Screen {
        Screen {
            terminal: ratatui::init(),
            state: State::new(),
        }
    }

    /// New data to show (ignored while paused), and alert changes since the last.
    pub fn update(
        &mut self,
        view: View,
        snapshot: Arc<Snapshot>,
        changes: Vec<AlertChange>,
        clock: &str,
    ) {
        self.state.update(view, snapshot, changes, clock);
    }

    /// The process whose detail pane is open.
    pub fn detail(&self) -> Option<u32> {
        self.state.detail
    }

    /// The detail pane's process's streams, one line each.
    pub fn set_streams(&mut self, lines: Vec<String>) {
        if !self.state.paused {
            self.state.streams = lines;
        }
    }

    /// Handles a key.
    pub fn key(&mut self, k: KeyEvent) -> Ask {
        self.state.key(k)
    }

    /// Draws the screen.
    pub fn draw(&mut self) -> std::io::Result<()> {
        let rows = self.state.rows();
        let state = &mut self.state;
        self.terminal.draw(|f| state.render(f, &rows)).map(|_| ())
    }
}

impl State {
    fn new() -> State {
        State {
            sort: (4, true),
            filter: (String::new(), false),
            paused: false,
            table: TableState::default(),
            detail: None,
            view: View::default(),
            snapshot: None,
            recent: VecDeque::new(),
            clock: String::new(),
            streams: Vec::new(),
        }
    }

    fn update(
        &mut self,
        view: View,
        snapshot: Arc<Snapshot>,
        changes: Vec<AlertChange>,
        clock: &str,
    ) {
        for c in changes {
            if self.recent.len() == RECENT_ALERTS {
                self.recent.pop_front();
            }
            self.recent.push_back(c);
        }
        if !self.paused {
            self.view = view;
            self.snapshot = Some(snapshot);
            clock.clone_into(&mut self.clock);
        }
    }

    fn key(&mut self, k: KeyEvent) -> Ask {
        if k.modifiers.contains(KeyModifiers::CONTROL) && k.code == KeyCode::Char('c') {
            return Ask::Quit;
        }
        if self.filter.1 {
            match k.code {
                KeyCode::Enter => self.filter.1 = false,
                KeyCode::Esc => self.filter = (String::new(), false),
                KeyCode::Backspace => {
                    self.filter.0.pop();
                }
                KeyCode::Char(c) if self.filter.0.len() < 64 => self.filter.0.push(c),
                _ => {}
            }
            return Ask::Redraw;
        }
        match k.code {
            KeyCode::Char('q') => return Ask::Quit,
            KeyCode::Esc if self.detail.is_some() => self.detail = None,
            KeyCode::Esc => self.filter.0.clear(),
            KeyCode::Char('/') => self.filter = (String::new(), true),
            KeyCode::Char('p') | KeyCode::Char(' ') => self.paused = !self.paused,
            KeyCode::Char('r') => self.sort.1 = !self.sort.1,
            KeyCode::Right | KeyCode::Char('>') => self.sort.0 = (self.sort.0 + 1) % COLUMNS.len(),
            KeyCode::Left | KeyCode::Char('<') => {
                self.sort.0 = (self.sort.0 + COLUMNS.len() - 1) % COLUMNS.len()
            }
            KeyCode::Down | KeyCode::Char('j') => self.table.select_next(),
            KeyCode::Up | KeyCode::Char('k') => self.table.select_previous(),
            KeyCode::Enter => {
                let rows = self.rows();
                self.detail = match (self.detail, self.table.selected().and_then(|i| rows.get(i))) {
                    (Some(_), _) => None,
                    (None, Some(r)) => Some(r.pid),
                    (None, None) => rows.first().map(|r| r.pid),
                };
            }
            _ => {}
        }
        Ask::Redraw
    }

    /// The rows shown: filtered by pid, comm or pod, sorted.
    fn rows(&self) -> Vec<Row> {
        let needle = self.filter.0.to_lowercase();
        let mut rows: Vec<Row> = self
            .view
            .rows
            .iter()
            .filter(|r| {
                needle.is_empty()
                    || format!("{} {} {}", r.pid, r.comm, r.pod)
                        .to_lowercase()
                        .contains(&needle)
            })
            .cloned()
            .collect();
        let (col, desc) = self.sort;
        rows.sort_by(|a, b| {
            let o = if col == 1 {
                a.comm.cmp(&b.comm)
            } else if col == 2 {
                a.pod.cmp(&b.pod)
            } else {
                (COLUMNS[col].key)(a).total_cmp(&(COLUMNS[col].key)(b))
            };
            let o = if col == 11 && o.is_eq() {
                alert_rank(a).total_cmp(&alert_rank(b))
            } else {
                o
            };
            if desc {
                o.reverse()
            } else {
                o
            }
        });
        rows
    }

    fn render(&mut self, f: &mut Frame, rows: &[Row]) {
        let area = f.area();
        let narrow = area.width < 130;
        let head = header_lines(&self.view, &self.clock);
        let detail_height = if self.detail.is_some() {
            area.height / 2
        } else {
            0
        };
        let [top, body, detail, help_row] = Layout::vertical([
            Constraint::Length(head.len() as u16),
            Constraint::Min(3),
            Constraint::Length(detail_height),
            Constraint::Length(1),
        ])
        .areas(area);
        f.render_widget(Paragraph::new(head), top);
        let cols: Vec<(usize, &Column)> = COLUMNS
            .iter()
            .enumerate()
            .filter(|(_, c)| c.narrow || !narrow)
            .collect();
        let titles = cols.iter().map(|(i, c)| {
            let mark = if *i == self.sort.0 {
                if self.sort.1 {
                    "v"
                } else {
                    "^"
                }
            } else {
                ""
            };
            Cell::from(format!("{}{mark}", c.title))
        });
        let mut widths: Vec<Constraint> = cols
            .iter()
            .map(|(_, c)| Constraint::Length(c.width))
            .collect();
        widths.push(Constraint::Fill(1));
        let lines = rows.iter().map(|r| {
            let fields: Vec<String> = text::row(r).split_whitespace().map(str::to_owned).collect();
            let mut cells: Vec<Cell> = cols
                .iter()
                .map(|(i, _)| Cell::from(fields.get(*i).cloned().unwrap_or_default()))
                .collect();
            cells.push(Cell::from(
                fields.get(12..).map(|a| a.join(" ")).unwrap_or_default(),
            ));
            TableRow::new(cells)
        });
        let t = Table::new(lines, widths)
            .header(
                TableRow::new(titles.chain([Cell::from("ALERT")]))
                    .style(Style::new().add_modifier(Modifier::REVERSED)),
            )
            .row_highlight_style(Style::new().add_modifier(Modifier::BOLD));
        f.render_stateful_widget(t, body, &mut self.table);
        if let Some(pid) = self.detail {
            f.render_widget(
                Paragraph::new(self.detail_lines(pid)).block(
                    Block::new()
                        .borders(Borders::TOP)
                        .title(format!(" pid {pid} ")),
                ),
                detail,
            );
        }
        let help = if self.filter.1 {
            format!(
                "filter: {}_  (Enter: keep, Esc: clear)",
                printable(&self.filter.0)
            )
        } else {
            format!(
                "q quit  </> sort  r reverse  / filter{}  p pause{}  up/down, Enter: details",
                if self.filter.0.is_empty() {
                    String::new()
                } else {
                    format!(" [{}]", printable(&self.filter.0))
                },
                if self.paused { " [paused]" } else { "" }
            )
        };
        f.render_widget(
            Paragraph::new(help).style(Style::new().add_modifier(Modifier::REVERSED)),
            help_row,
        );
    }

    /// The detail pane of `pid`: its kernels by total time (count, p99 bucket), its alerts.
    fn detail_lines(&self, pid: u32) -> Vec<Line<'static>> {
        let mut lines = Vec::new();
        let Some(s) = &self.snapshot else {
            return lines;
        };
        let mut kernels: Vec<&crate::sinks::metrics::snapshot::CallRow> = s
            .calls
            .iter()
            .filter(|c| c.process.pid == pid && !c.kernel.is_empty())
            .collect();
        kernels.sort_by_key(|c| std::cmp::Reverse(c.series.sum_ns));
        lines.push(Line::from(
            "top kernels by launch time: calls, total ms, p99 (bucket bound)",
        ));
        for c in kernels.iter().take(5) {
            lines.push(Line::from(format!(
                "  {:<40} {:>10} {:>10.3} {:>8}",
                printable(&c.kernel).chars().take(40).collect::<String>(),
                c.series.calls,
                c.series.sum_ns as f64 / 1e6,
                p99_bound(&c.series),
            )));
        }
        lines.push(Line::from("streams: batches, batch span ms, host wait ms"));
        for l in &self.streams {
            lines.push(Line::from(format!("  {l}")));
        }
        lines.push(Line::from("alerts (newest last):"));
        for c in self.recent.iter().filter(|c| c.victim.pid == pid) {
            lines.push(Line::from(format!(
                "  {} {} {}: {}",
                c.at,
                c.alert,
                c.state.as_str(),
                printable(&c.summary())
            )));
        }
        lines
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

/// The upper bound of the Prometheus bucket holding a series' 99th percentile call.
fn p99_bound(s: &crate::aggregate::Series) -> String {
    let want = (s.calls as f64 * 0.99).ceil() as u64;
    let mut seen = 0;
    for (i, n) in s.buckets.iter().enumerate() {
        seen += n;
        if seen >= want && want > 0 {
            return crate::aggregate::BUCKETS
                .get(i)
                .map_or_else(|| ">10s".into(), |le| format!("{:.0}us", le * 1e6));
        }
    }
    "-".into()
}

/// The header: the screen's first line and one per GPU (or the NVML line).
fn header_lines(v: &View, clock: &str) -> Vec<Line<'static>> {
    let counts = View {
        rows: Vec::new(),
        ..v.clone()
    };
    text::screen(&counts, clock)
        .lines()
        .filter(|l| !l.trim_start().starts_with("PID "))
        .map(|l| Line::from(l.replace("processes: 0", &format!("processes: {}", v.rows.len()))))
        .collect()
}

#[cfg(test)]
mod tests {
    use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    use super::*;

    fn row(pid: u32, comm: &str, rate: f64) -> Row {
        Row {
            pid,
            comm: comm.into(),
            pod: String::new(),
            gpus: vec![],
            launches_per_s: rate,
            launch_p50_p99: None,
            wait_per_launch: None,
            copy_bytes_per_s: 0.0,
            memory_bytes: 0,
            gpu_share: 0.0,
            alert: None,
        }
    }

    fn press(s: &mut State, code: KeyCode) -> Ask {
        s.key(KeyEvent::new(code, KeyModifiers::NONE))
    }

    #[test]
    fn keys_sort_filter_pause_and_quit() {
        let mut s = State::new();
        let view = View {
            rows: vec![
                row(1, "trainer", 10.0),
                row(2, "model-server", 30.0),
                row(3, "etl", 20.0),
            ],
            ..View::default()
        };
        s.update(
            view.clone(),
            Arc::new(Snapshot::default()),
            Vec::new(),
            "00:00:00",
        );
        let pids = |s: &State| s.rows().iter().map(|r| r.pid).collect::<Vec<_>>();
        assert_eq!(pids(&s), [2, 3, 1], "busiest first");
        press(&mut s, KeyCode::Char('r'));
        assert_eq!(pids(&s), [1, 3, 2]);
        // One column left of LAUNCH/S is GPU (none: equal), then POD, then COMM, by name.
        for _ in 0..3 {
            press(&mut s, KeyCode::Left);
        }
        assert_eq!(pids(&s), [3, 2, 1], "by name, a to z");
        for c in ['/', 'M', 'O', 'D'] {
            press(&mut s, KeyCode::Char(c));
        }
        assert_eq!(pids(&s), [2], "a filter ignores case");
        press(&mut s, KeyCode::Enter);
        press(&mut s, KeyCode::Esc);
        assert_eq!(pids(&s).len(), 3);
        press(&mut s, KeyCode::Char('p'));
        s.update(
            View::default(),
            Arc::new(Snapshot::default()),
            Vec::new(),
            "00:00:01",
        );
        assert_eq!(pids(&s).len(), 3, "paused: the data stays");
        assert_eq!(press(&mut s, KeyCode::Char('q')), Ask::Quit);
        assert_eq!(
            s.key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
            Ask::Quit
        );
    }
}
