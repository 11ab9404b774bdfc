//! Small tables for summaries: printed aligned on the terminal and as
//! Markdown in the report.

/// A titled table of strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// Heading shown above the table.
    pub title: String,
    /// Optional sentence under the title (what the numbers mean).
    pub note: String,
    /// Column headers.
    pub headers: Vec<String>,
    /// Rows, each as long as `headers`.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these headers.
    pub fn new(title: impl Into<String>, headers: &[&str]) -> Table {
        Table {
            title: title.into(),
            note: String::new(),
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Sets the explanatory note.
    pub fn with_note(mut self, note: impl Into<String>) -> Table {
        self.note = note.into();
        self
    }

    /// Appends a row (padded or cut to the header count).
    pub fn push(&mut self, mut row: Vec<String>) {
        row.resize(self.headers.len(), String::new());
        self.rows.push(row);
    }

    fn widths(&self) -> Vec<usize> {
        let mut w: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                w[i] = w[i].max(cell.chars().count());
            }
        }
        w
    }

    /// Aligned plain text: first column left, the rest right.
    pub fn to_text(&self) -> String {
        let w = self.widths();
        let line = |cells: &[String]| {
            cells
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    if i == 0 {
                        format!("{c:<width$}", width = w[i])
                    } else {
                        format!("{c:>width$}", width = w[i])
                    }
                })
                .collect::<Vec<_>>()
                .join("  ")
        };
        let mut out = format!("-- {}\n", self.title);
        if !self.note.is_empty() {
            out += &format!("   {}\n", self.note);
        }
        out += &line(&self.headers);
        out.push('\n');
        for row in &self.rows {
            out += &line(row);
            out.push('\n');
        }
        out
    }

    /// A GitHub-flavoured Markdown table under a `####` heading.
    pub fn to_markdown(&self) -> String {
        let esc = |s: &str| s.replace('|', "\\|");
        let mut out = format!("#### {}\n\n", self.title);
        if !self.note.is_empty() {
            out += &format!("{}\n\n", self.note);
        }
        out += &format!(
            "| {} |\n",
            self.headers
                .iter()
                .map(|h| esc(h))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        out += &format!(
            "|{}\n",
            (0..self.headers.len())
                .map(|i| if i == 0 { " --- |" } else { " ---: |" })
                .collect::<String>()
        );
        for row in &self.rows {
            out += &format!(
                "| {} |\n",
                row.iter().map(|c| esc(c)).collect::<Vec<_>>().join(" | ")
            );
        }
        out
    }
}

/// Formats a ratio as `1.23x`, or `-` when absent.
pub fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
}

/// Formats a rate in millions per second, or `-` when absent.
pub fn fmt_mops(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.2}", v / 1e6))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_both_ways() {
        let mut t = Table::new("T", &["key", "a|b"]);
        t.push(vec!["4".into(), "1.00x".into()]);
        t.push(vec!["128".into()]);
        let md = t.to_markdown();
        assert!(md.contains("| key | a\\|b |"));
        assert!(md.contains("| --- | ---: |"));
        assert!(md.contains("| 128 |  |"));
        let txt = t.to_text();
        assert!(txt.contains("4    1.00x"), "{txt}");
    }
}
