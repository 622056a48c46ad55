//! The rows copy-bench reports (GB/s against a baseline, a goal met or only reported) and the
//! Markdown it prints: the row names, columns and JSON keys are what scripts/gpu-session.sh and
//! the docs read.
use crate::measure::Stat;

#[derive(serde::Serialize)]
pub struct Row {
    case: String,
    bytes: usize,
    ours: String,
    ours_gbps: f64,
    ours_stat: Stat,
    against: String,
    baseline_gbps: Option<f64>,
    /// ours / baseline, in bandwidth.
    ratio: Option<f64>,
    goal: Option<f64>,
    met: Option<bool>,
}

pub struct Table {
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
}

impl Table {
    #[allow(clippy::too_many_arguments)]
    pub fn add(&mut self, case: &str, bytes: usize, ours: &str, s: Stat, against: &str, baseline_gbps: Option<f64>, goal: Option<f64>) {
        let ours_gbps = s.gbps(bytes);
        let ratio = baseline_gbps.map(|b| ours_gbps / b);
        let met = goal.and_then(|g| ratio.map(|r| r >= g));
        eprintln!(
            "  {case}: {ours_gbps:.2} GB/s{}",
            ratio.map(|r| format!(" ({r:.3}x {against}{})", goal.map(|g| format!(", goal {g}x")).unwrap_or_default())).unwrap_or_default()
        );
        self.rows.push(Row {
            case: case.into(),
            bytes,
            ours: ours.into(),
            ours_gbps,
            ours_stat: s,
            against: against.into(),
            baseline_gbps,
            ratio,
            goal,
            met,
        });
    }

    /// The rows and the notes, as Markdown on stdout.
    pub fn print(&self) {
        println!("| case | ours | GB/s [min, max] | vs | ratio | goal | met |");
        println!("| --- | --- | --- | --- | --- | --- | --- |");
        for r in &self.rows {
            let s = &r.ours_stat;
            let (lo, hi) = (r.bytes as f64 / s.max_s / 1e9, r.bytes as f64 / s.min_s / 1e9);
            println!(
                "| {} | {} | {:.2} [{lo:.2}, {hi:.2}] | {} | {} | {} | {} |",
                r.case,
                r.ours,
                r.ours_gbps,
                if r.against.is_empty() { "—".into() } else { format!("{} {:.2}", r.against, r.baseline_gbps.unwrap_or(f64::NAN)) },
                r.ratio.map(|x| format!("{x:.3}x")).unwrap_or_else(|| "—".into()),
                r.goal.map(|g| format!("≥ {g}x")).unwrap_or_else(|| "reported".into()),
                r.met.map(|m| if m { "yes" } else { "**no**" }).unwrap_or("—"),
            );
        }
        println!();
        for n in &self.notes {
            println!("- {n}");
        }
    }
}
