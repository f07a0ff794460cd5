//! The report's section on real device interfaces: the write stream the FDP backend issued
//! on an NVMe FDP namespace (in a QEMU VM, `valet_tests::vm`) replayed on the
//! conventional-SSD model with and without its placement identifiers, next to FDPFS's
//! published figure. Appended to `report.md`; where no VM can run here it says so instead.

use std::path::Path;

use super::markdown::{Doc, Table};

/// FDPFS (Kim et al., LES '24): average WAF reduction with two placement identifiers on
/// filebench oltp.
const FDPFS_REDUCTION: f64 = 0.31;

/// Runs the FDP VM and appends the section to `out/report.md`.
pub fn append(out: &Path) -> Result<(), String> {
    eprintln!("report: FDP write stream on the SSD model (QEMU VM)");
    let section = section(valet_tests::vm::fdp_ssd_model_figures());
    let path = out.join("report.md");
    let mut text =
        std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.push('\n');
    text.push_str(&section);
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The section for the VM's figures (`None`: no VM here).
fn section(figures: Option<Result<Vec<(String, f64)>, String>>) -> String {
    let mut doc = Doc::default();
    doc.heading(2, "FDP: the backend's write stream on the SSD model");
    match figures {
        None => doc.paragraph(
            "Not measured: QEMU or the VM kernel is missing here (`.ci/setup-vm` installs them).",
        ),
        Some(Err(e)) => doc.paragraph(&format!("The FDP VM run failed: {e}")),
        Some(Ok(fields)) => {
            let get = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
            let cell = |k: &str, digits: usize| {
                get(k).map_or("-".to_string(), |v| format!("{v:.digits$}"))
            };
            doc.paragraph(
                "An LSM-shaped workload (write-ahead logs of 4,000-byte records with an \
                 fdatasync every eight, each previous log's 1 MiB table written between the \
                 records, FIFO table deletion at about 75 % use, three device-fulls) runs on \
                 the store over the FDP backend on QEMU's emulated NVMe FDP namespace. Every \
                 command the backend sent (LBA, length, placement identifier; deallocations \
                 at zone resets) is replayed on the SSD model (1 MiB erase units, 15 % spare, \
                 four reclaim unit handles), once with the identifiers and once without. QEMU \
                 models no flash GC: these WAFs are the model's. The FDPFS figure is the \
                 paper's, on filebench oltp, not measured here.",
            );
            let mut t = Table::new(&[
                "run",
                "host MiB",
                "store WAF",
                "SSD WAF with placement ids",
                "SSD WAF without",
                "reduction",
                "FDPFS reduction (paper)",
            ]);
            t.row(vec![
                "LSM on the FDP backend (VM)".into(),
                cell("host_mib", 1),
                cell("store_waf", 3),
                cell("waf_with_placement", 3),
                cell("waf_without", 3),
                cell("reduction", 3),
                format!("{FDPFS_REDUCTION:.2} (average, filebench oltp)"),
            ]);
            doc.table(&t);
        }
    }
    doc.render().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_shows_the_vm_figures_or_why_there_are_none() {
        let fields = vec![
            ("host_mib".to_string(), 144.9),
            ("store_waf".to_string(), 1.04),
            ("waf_with_placement".to_string(), 1.0),
            ("waf_without".to_string(), 1.438),
            ("reduction".to_string(), 0.438),
        ];
        let text = section(Some(Ok(fields)));
        assert!(
            text.contains(
                "| LSM on the FDP backend (VM) | 144.9 | 1.040 | 1.000 | 1.438 | 0.438 | 0.31"
            ),
            "{text}"
        );
        assert!(section(None).contains("Not measured"));
        assert!(section(Some(Err("boom".into()))).contains("failed: boom"));
    }
}
