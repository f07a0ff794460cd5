//! The report's markdown: headings, paragraphs, tables and figure links, in the order added.

/// A markdown table: a header row and body rows of the same width.
#[derive(Clone, Debug, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<S: AsRef<str>>(headers: &[S]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.as_ref().to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are left empty, extra ones dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// GitHub-flavoured markdown; `|` in a cell is escaped.
    pub fn render(&self) -> String {
        let line = |cells: &[String]| {
            let cells: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
            format!("| {} |\n", cells.join(" | "))
        };
        let mut out = line(&self.headers);
        out.push_str(&line(&vec!["---".to_string(); self.headers.len()]));
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// A markdown document built top to bottom.
#[derive(Clone, Debug, Default)]
pub struct Doc {
    text: String,
}

impl Doc {
    pub fn heading(&mut self, level: usize, title: &str) {
        self.block(&format!("{} {title}", "#".repeat(level.clamp(1, 6))));
    }

    pub fn paragraph(&mut self, text: &str) {
        self.block(text.trim());
    }

    pub fn table(&mut self, table: &Table) {
        self.block(table.render().trim_end());
    }

    /// An image link to a figure written next to the report.
    pub fn figure(&mut self, alt: &str, file: &str) {
        self.block(&format!("![{alt}]({file})"));
    }

    /// A bulleted list.
    pub fn list<S: AsRef<str>>(&mut self, items: &[S]) {
        if items.is_empty() {
            return;
        }
        let lines: Vec<String> = items.iter().map(|i| format!("- {}", i.as_ref())).collect();
        self.block(&lines.join("\n"));
    }

    fn block(&mut self, text: &str) {
        if !self.text.is_empty() {
            self.text.push('\n');
        }
        self.text.push_str(text);
        self.text.push('\n');
    }

    pub fn render(&self) -> &str {
        &self.text
    }
}

/// A number with 3 significant digits at most and thousands kept whole (`1234567`, `12.3`,
/// `0.123`); `-` for none.
pub fn num(value: Option<f64>) -> String {
    match value {
        None => "-".into(),
        Some(v) if !v.is_finite() => "-".into(),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 10.0 => format!("{v:.1}"),
        Some(v) if v.abs() >= 1.0 => format!("{v:.2}"),
        Some(v) => format!("{v:.3}"),
    }
}

/// A ratio with two decimals and an `×`; `-` for none.
pub fn ratio(value: Option<f64>) -> String {
    match value {
        Some(v) if v.is_finite() => format!("{v:.2}×"),
        _ => "-".into(),
    }
}

/// Bytes as MiB with one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1}", in_mib(bytes))
}

/// Bytes in MiB.
pub fn in_mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// Whether a measured value meets its target, as a table cell.
pub fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "meets",
        Some(false) => "misses",
        None => "n/a",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_renders_header_separator_and_padded_rows() {
        let mut t = Table::new(&["guest", "ops/s", "note"]);
        t.row(vec!["leveldb".into(), num(Some(320204.4))]);
        t.row(vec![
            "a|b".into(),
            num(Some(1.234)),
            "x".into(),
            "dropped".into(),
        ]);
        assert_eq!(
            t.render(),
            "| guest | ops/s | note |\n\
             | --- | --- | --- |\n\
             | leveldb | 320204 |  |\n\
             | a\\|b | 1.23 | x |\n"
        );
        assert!(!t.is_empty());
    }

    #[test]
    fn doc_separates_blocks_with_blank_lines() {
        let mut d = Doc::default();
        d.heading(1, "Report");
        d.paragraph("  Scale small.\n");
        let mut t = Table::new(&["a"]);
        t.row(vec!["1".into()]);
        d.table(&t);
        d.figure("ops", "ops.svg");
        d.list(&["one", "two"]);
        d.list::<&str>(&[]);
        assert_eq!(
            d.render(),
            "# Report\n\nScale small.\n\n| a |\n| --- |\n| 1 |\n\n![ops](ops.svg)\n\n- one\n- two\n"
        );
    }

    #[test]
    fn number_formats() {
        assert_eq!(num(None), "-");
        assert_eq!(num(Some(f64::NAN)), "-");
        assert_eq!(num(Some(12.345)), "12.3");
        assert_eq!(num(Some(0.12345)), "0.123");
        assert_eq!(ratio(Some(1.404)), "1.40×");
        assert_eq!(ratio(None), "-");
        assert_eq!(mib(3 << 20), "3.0");
        assert_eq!(verdict(Some(false)), "misses");
    }
}
