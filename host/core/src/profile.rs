//! Model profiles: measured latency per batch size and published accuracy, as a
//! versioned TOML data file under `profiles/`.
//!
//! ```toml
//! version = 1
//! name = "imagenet-light-cpu"
//! device = "cpu: Intel Xeon ..., 1 intra-op thread"
//! source = "measured by `sluice profile` on ... (date)"
//!
//! [[model]]
//! name = "resnet50"
//! accuracy = 0.7613
//! accuracy_source = "torchvision resnet50 IMAGENET1K_V1, acc@1 76.130"
//! file = "resnet50.onnx"
//! batch_sizes = [1, 2, 4, 8]
//! p50_us = [101000, 180000, 350000, 690000]
//! p95_us = [104000, 186000, 362000, 702000]
//! p99_us = [105000, 188000, 365000, 705000]
//! runs = 20
//! ```
//!
//! Parsing is strict: unknown fields, a missing or other `version`, and content
//! that breaks a rule (see [`Profile::parse`]) are errors that name the file, the
//! line and the field. [`Profile::to_toml_string`] writes the same format back.

use std::fmt;
use std::ops::Range;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;
use toml::Spanned;

/// The format version this code reads and writes.
pub const FORMAT_VERSION: i64 = 1;

/// A profile file: one device, several models.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// `name = "imagenet-light-cpu"`: what the profile is called.
    pub name: String,
    /// `device = "cpu: ..., 1 intra-op thread"`: where it was measured.
    pub device: String,
    /// `source = "measured by ..."`: free text on how and when.
    pub source: String,
    /// `[[model]]` tables, in file order.
    pub models: Vec<ModelProfile>,
}

/// One `[[model]]` table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelProfile {
    /// `name = "resnet50"`: unique within the profile.
    pub name: String,
    /// `accuracy = 0.7613`: top-1 accuracy in [0, 1].
    pub accuracy: f64,
    /// `accuracy_source = "..."`: citation of the published figure.
    pub accuracy_source: String,
    /// `file = "resnet50.onnx"` (optional): the model file, relative to the model
    /// directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// `batch_sizes = [1, 2, 4, 8]`: measured sizes, strictly increasing, ≥ 1.
    pub batch_sizes: Vec<u32>,
    /// `p50_us = [...]`: median latency in µs, one per batch size.
    pub p50_us: Vec<u64>,
    /// `p95_us = [...]`: 95th-percentile latency in µs, one per batch size.
    pub p95_us: Vec<u64>,
    /// `p99_us = [...]`: 99th-percentile latency in µs, one per batch size.
    pub p99_us: Vec<u64>,
    /// `runs = 20` (optional): timed runs behind each percentile (the fewest, when
    /// they differ between batch sizes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runs: Option<u32>,
}

/// Which latency percentile to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Percentile {
    /// The median (Proteus's simulator uses it).
    P50,
    /// The 95th percentile (RAMSIS's policy generator uses it).
    P95,
    /// The 99th percentile.
    P99,
}

impl Percentile {
    /// `"p50"`, `"p95"` or `"p99"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Percentile::P50 => "p50",
            Percentile::P95 => "p95",
            Percentile::P99 => "p99",
        }
    }

    /// The quantile in [0, 1]: 0.5, 0.95 or 0.99.
    pub fn quantile(self) -> f64 {
        match self {
            Percentile::P50 => 0.50,
            Percentile::P95 => 0.95,
            Percentile::P99 => 0.99,
        }
    }
}

impl fmt::Display for Percentile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that is not `p50`, `p95` or `p99`.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("unknown percentile `{0}` (expected p50, p95 or p99)")]
pub struct ParsePercentileError(pub String);

impl FromStr for Percentile {
    type Err = ParsePercentileError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "p50" => Ok(Percentile::P50),
            "p95" => Ok(Percentile::P95),
            "p99" => Ok(Percentile::P99),
            _ => Err(ParsePercentileError(s.to_string())),
        }
    }
}

/// Why a profile could not be loaded. `Display` starts with `file:line:` where
/// the line is known.
#[derive(Debug, Error)]
pub enum ProfileError {
    /// The file could not be read.
    #[error("{origin}: cannot read: {source}")]
    Read {
        /// The file.
        origin: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Not valid TOML, or a field that is unknown, missing or of the wrong type.
    #[error("{origin}{}: {message}", at_line(.line))]
    Syntax {
        /// The file (or other origin given to [`Profile::parse`]).
        origin: String,
        /// 1-based line, when known.
        line: Option<usize>,
        /// What the TOML parser said.
        message: String,
    },
    /// Well-formed, but a value breaks a rule of the format.
    #[error("{origin}{}: {}{message}", at_line(.line), in_model(.model))]
    Invalid {
        /// The file (or other origin given to [`Profile::parse`]).
        origin: String,
        /// 1-based line of the offending value.
        line: Option<usize>,
        /// The `[[model]]` it is in, if any.
        model: Option<String>,
        /// The field and what was expected of it.
        message: String,
    },
}

fn at_line(line: &Option<usize>) -> String {
    line.map(|l| format!(":{l}")).unwrap_or_default()
}

fn in_model(model: &Option<String>) -> String {
    model.as_ref().map(|m| format!("model `{m}`: ")).unwrap_or_default()
}

// What the file holds, with spans for the error messages. Kept apart from the
// public types so that those stay plain data.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    version: Option<Spanned<i64>>,
    name: Spanned<String>,
    device: String,
    source: String,
    #[serde(default)]
    model: Vec<Spanned<RawModel>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: Spanned<String>,
    accuracy: Spanned<f64>,
    accuracy_source: String,
    file: Option<String>,
    batch_sizes: Spanned<Vec<u32>>,
    p50_us: Spanned<Vec<u64>>,
    p95_us: Spanned<Vec<u64>>,
    p99_us: Spanned<Vec<u64>>,
    runs: Option<Spanned<u32>>,
}

// The written form: `version` first, then the fields in the documented order.
#[derive(Serialize)]
struct OutProfile<'a> {
    version: i64,
    name: &'a str,
    device: &'a str,
    source: &'a str,
    model: &'a [ModelProfile],
}

impl Profile {
    /// Reads and validates a profile file.
    pub fn load(path: &Path) -> Result<Profile, ProfileError> {
        let origin = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|source| ProfileError::Read { origin: origin.clone(), source })?;
        Profile::parse(&text, &origin)
    }

    /// Parses and validates profile text; `origin` names it in errors (usually the
    /// file path).
    ///
    /// Rules: `version = 1`; at least one `[[model]]`; model names non-empty and
    /// unique; `accuracy` in [0, 1]; `batch_sizes` non-empty, each ≥ 1, strictly
    /// increasing; `p50_us`, `p95_us`, `p99_us` one entry per batch size, with
    /// p50 ≤ p95 ≤ p99 at each size; `runs` ≥ 1 when present.
    pub fn parse(text: &str, origin: &str) -> Result<Profile, ProfileError> {
        let raw: RawProfile = toml::from_str(text).map_err(|e| ProfileError::Syntax {
            origin: origin.to_string(),
            line: e.span().map(|s| line_of(text, s.start)),
            message: e.message().trim_end().to_string(),
        })?;
        let invalid = |span: Option<Range<usize>>, model: Option<&str>, message: String| ProfileError::Invalid {
            origin: origin.to_string(),
            line: span.map(|s| line_of(text, s.start)),
            model: model.map(str::to_string),
            message,
        };

        match &raw.version {
            None => return Err(invalid(None, None, format!("`version = {FORMAT_VERSION}` is required"))),
            Some(v) if *v.get_ref() != FORMAT_VERSION => {
                return Err(invalid(
                    Some(v.span()),
                    None,
                    format!("version {} is not supported (this sluice reads version {FORMAT_VERSION})", v.get_ref()),
                ))
            }
            Some(_) => {}
        }
        if raw.name.get_ref().trim().is_empty() {
            return Err(invalid(Some(raw.name.span()), None, "name must not be empty".into()));
        }
        if raw.model.is_empty() {
            return Err(invalid(None, None, "no [[model]] tables: a profile needs at least one model".into()));
        }

        let mut models: Vec<ModelProfile> = Vec::with_capacity(raw.model.len());
        for spanned in raw.model {
            let m = spanned.into_inner();
            let name = m.name.get_ref().clone();
            if name.trim().is_empty() {
                return Err(invalid(Some(m.name.span()), None, "model name must not be empty".into()));
            }
            if models.iter().any(|seen| seen.name == name) {
                return Err(invalid(
                    Some(m.name.span()),
                    Some(&name),
                    "the name is used by an earlier [[model]]".into(),
                ));
            }
            let model_err = |span: Range<usize>, message: String| invalid(Some(span), Some(&name), message);

            let accuracy = *m.accuracy.get_ref();
            if !(0.0..=1.0).contains(&accuracy) {
                return Err(model_err(m.accuracy.span(), format!("accuracy {accuracy} is outside [0, 1]")));
            }
            let sizes = m.batch_sizes.get_ref();
            if sizes.is_empty() {
                return Err(model_err(m.batch_sizes.span(), "batch_sizes is empty".into()));
            }
            if sizes[0] == 0 {
                return Err(model_err(m.batch_sizes.span(), "batch_sizes must be >= 1, found 0".into()));
            }
            if let Some(w) = sizes.windows(2).find(|w| w[1] <= w[0]) {
                return Err(model_err(
                    m.batch_sizes.span(),
                    format!("batch_sizes must be strictly increasing, but {} follows {}", w[1], w[0]),
                ));
            }
            for (field, values) in [("p50_us", &m.p50_us), ("p95_us", &m.p95_us), ("p99_us", &m.p99_us)] {
                if values.get_ref().len() != sizes.len() {
                    return Err(model_err(
                        values.span(),
                        format!("{field} has {} entries but batch_sizes has {}", values.get_ref().len(), sizes.len()),
                    ));
                }
            }
            for (i, &b) in sizes.iter().enumerate() {
                let (p50, p95, p99) = (m.p50_us.get_ref()[i], m.p95_us.get_ref()[i], m.p99_us.get_ref()[i]);
                if p95 < p50 {
                    return Err(model_err(
                        m.p95_us.span(),
                        format!("at batch size {b}, p95_us ({p95}) is below p50_us ({p50})"),
                    ));
                }
                if p99 < p95 {
                    return Err(model_err(
                        m.p99_us.span(),
                        format!("at batch size {b}, p99_us ({p99}) is below p95_us ({p95})"),
                    ));
                }
            }
            if let Some(runs) = &m.runs {
                if *runs.get_ref() == 0 {
                    return Err(model_err(runs.span(), "runs must be >= 1".into()));
                }
            }
            models.push(ModelProfile {
                name,
                accuracy,
                accuracy_source: m.accuracy_source,
                file: m.file,
                batch_sizes: m.batch_sizes.into_inner(),
                p50_us: m.p50_us.into_inner(),
                p95_us: m.p95_us.into_inner(),
                p99_us: m.p99_us.into_inner(),
                runs: m.runs.map(Spanned::into_inner),
            });
        }
        Ok(Profile { name: raw.name.into_inner(), device: raw.device, source: raw.source, models })
    }

    /// The profile as TOML, in the format [`Profile::parse`] reads (the writer of
    /// `sluice profile`). Parsing the result gives back an equal profile.
    pub fn to_toml_string(&self) -> String {
        let out = OutProfile {
            version: FORMAT_VERSION,
            name: &self.name,
            device: &self.device,
            source: &self.source,
            model: &self.models,
        };
        // Strings, integers, floats and arrays of them always serialize.
        let body = toml::to_string(&out).expect("a profile always serializes to TOML");
        format!("# sluice model profile (format version {FORMAT_VERSION}): latency in µs per batch size, top-1 accuracy.\n{body}")
    }

    /// The model called `name`.
    /// The models an app serves, in the app's order (every model when `names` is
    /// `None`), as policies see them: id = position, dense latency table of
    /// percentile `p` truncated to `max_batch`. The error names the missing model
    /// and lists the profile's.
    pub fn policy_models(
        &self,
        names: Option<&[String]>,
        p: Percentile,
        max_batch: Option<u32>,
    ) -> Result<Vec<(sluice_sdk::Model, &ModelProfile)>, NotInProfile> {
        let all: Vec<String>;
        let names = match names {
            Some(n) => n,
            None => {
                all = self.models.iter().map(|m| m.name.clone()).collect();
                &all
            }
        };
        names
            .iter()
            .enumerate()
            .map(|(id, name)| {
                let m = self.model(name).ok_or_else(|| NotInProfile {
                    model: name.clone(),
                    profile: self.name.clone(),
                    known: self.models.iter().map(|m| m.name.clone()).collect(),
                })?;
                let mut latency = m.latency_table(p);
                if let Some(cap) = max_batch {
                    latency.truncate(cap as usize);
                }
                let model = sluice_sdk::Model { id: id as u32, name: name.clone(), accuracy: m.accuracy, latency };
                Ok((model, m))
            })
            .collect()
    }

    /// The model called `name`.
    pub fn model(&self, name: &str) -> Option<&ModelProfile> {
        self.models.iter().find(|m| m.name == name)
    }
}

impl ModelProfile {
    /// The measured latencies (µs) for percentile `p`, one per entry of
    /// `batch_sizes`.
    pub fn measured_us(&self, p: Percentile) -> &[u64] {
        match p {
            Percentile::P50 => &self.p50_us,
            Percentile::P95 => &self.p95_us,
            Percentile::P99 => &self.p99_us,
        }
    }

    /// The largest measured batch size (0 when there is none).
    pub fn max_batch(&self) -> u32 {
        self.batch_sizes.last().copied().unwrap_or(0)
    }

    /// Dense latency table in µs for batch sizes `1..=max_batch()`: `table[b - 1]`,
    /// the shape the policy contract's `model.latency` expects.
    ///
    /// Sizes between two measured ones are linearly interpolated (rounded to the
    /// nearest µs); sizes below the smallest measured one take its latency (a
    /// conservative choice: never promise less than was measured). The table is
    /// then made non-decreasing in batch size the way RAMSIS's generator (and its
    /// authors' code) does: from the largest size down, each entry is lowered to the
    /// next size's when it exceeds it. A bigger batch measured faster means the
    /// smaller one's percentile caught noise (the text profile's BERT-tiny p95 is
    /// 122 ms at batch 2 and 17 ms at batch 8); raising everything after such an
    /// outlier instead would tell policies that every larger batch misses the SLO,
    /// and the host's tables would disagree with the ones RAMSIS generated from.
    pub fn latency_table(&self, p: Percentile) -> Vec<u64> {
        let values = self.measured_us(p);
        let points: Vec<(u32, u64)> = self.batch_sizes.iter().copied().zip(values.iter().copied()).collect();
        let Some(&(_, first)) = points.first() else { return Vec::new() };
        let max = points.last().map_or(0, |&(b, _)| b);
        let mut table = Vec::with_capacity(max as usize);
        let mut next = 0; // index of the first measured point with size >= b
        for b in 1..=max {
            while points[next].0 < b {
                next += 1;
            }
            let (b1, v1) = points[next];
            let value = if b1 == b {
                v1
            } else if next == 0 {
                first
            } else {
                let (b0, v0) = points[next - 1];
                let t = f64::from(b - b0) / f64::from(b1 - b0);
                (v0 as f64 + t * (v1 as f64 - v0 as f64)).round() as u64
            };
            table.push(value);
        }
        // RAMSIS's monotone fix, as its authors' code does it: from the largest size
        // down, lower each latency that exceeds the next size's to it.
        for i in (1..table.len()).rev() {
            table[i - 1] = table[i - 1].min(table[i]);
        }
        table
    }
}

/// 1-based line of byte offset `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())].iter().filter(|&&c| c == b'\n').count() + 1
}

/// The text of a synthetic profile for the emulated executor: three variants,
/// `small` (accuracy 0.60), `medium` (0.70) and `large` (0.80), batch sizes 1–8,
/// latency 1, 2 and 4 ms at batch 1 growing by 0.25, 0.5 and 1 ms per further
/// request, every latency × `scale` (0: zero latency). What tests, the cluster demo
/// and benchmarks serve where the model does not matter.
pub fn synthetic_emulated(name: &str, source: &str, scale: f64) -> String {
    let models = [("small", 0.60, 1000.0, 250.0), ("medium", 0.70, 2000.0, 500.0), ("large", 0.80, 4000.0, 1000.0)];
    let mut s = format!("version = 1\nname = \"{name}\"\ndevice = \"emulated\"\nsource = \"{source}\"\n");
    for (model, acc, base, per) in models {
        let lat: Vec<String> =
            (1..=8).map(|b| format!("{}", ((base + per * (b - 1) as f64) * scale).round() as u64)).collect();
        let l = lat.join(", ");
        s.push_str(&format!(
            "\n[[model]]\nname = \"{model}\"\naccuracy = {acc}\naccuracy_source = \"synthetic\"\nbatch_sizes = [1, 2, 3, 4, 5, 6, 7, 8]\np50_us = [{l}]\np95_us = [{l}]\np99_us = [{l}]\n"
        ));
    }
    s
}

/// A model an app names that its profile lacks ([`Profile::policy_models`]).
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("`{model}` is not in profile {profile} (it has: {})", .known.join(", "))]
pub struct NotInProfile {
    /// The name asked for.
    pub model: String,
    /// The profile's name.
    pub profile: String,
    /// The profile's models.
    pub known: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"version = 1
name = "test-cpu"
device = "cpu: test, 1 intra-op thread"
source = "hand-written for tests"

[[model]]
name = "small"
accuracy = 0.5
accuracy_source = "made up"
file = "small.onnx"
batch_sizes = [1, 2, 4, 8]
p50_us = [10, 18, 30, 70]
p95_us = [12, 20, 33, 80]
p99_us = [13, 21, 35, 90]
runs = 20

[[model]]
name = "big"
accuracy = 0.75
accuracy_source = "also made up"
batch_sizes = [1, 4]
p50_us = [100, 90]
p95_us = [110, 95]
p99_us = [120, 99]
"#;

    fn err(text: &str) -> String {
        Profile::parse(text, "profiles/x.toml").unwrap_err().to_string()
    }

    #[test]
    fn parses_the_documented_shape() {
        let p = Profile::parse(GOOD, "good.toml").unwrap();
        assert_eq!(p.name, "test-cpu");
        assert_eq!(p.models.len(), 2);
        let small = p.model("small").unwrap();
        assert_eq!(small.file.as_deref(), Some("small.onnx"));
        assert_eq!(small.runs, Some(20));
        assert_eq!(small.measured_us(Percentile::P95), &[12, 20, 33, 80]);
        assert_eq!(p.model("big").unwrap().file, None);
        assert_eq!(p.model("big").unwrap().runs, None);
    }

    #[test]
    fn a_model_not_in_the_profile_is_named() {
        let p = Profile::parse(GOOD, "good.toml").unwrap();
        let e = p.policy_models(Some(&["small".into(), "huge".into()]), Percentile::P95, None).unwrap_err();
        assert_eq!(e.model, "huge");
        assert_eq!(e.to_string(), "`huge` is not in profile test-cpu (it has: small, big)");
        assert_eq!(p.policy_models(None, Percentile::P95, Some(2)).unwrap()[0].0.latency.len(), 2);
    }

    #[test]
    fn writer_round_trips() {
        let p = Profile::parse(GOOD, "good.toml").unwrap();
        let text = p.to_toml_string();
        assert_eq!(Profile::parse(&text, "written.toml").unwrap(), p);
        assert!(text.contains("version = 1\n"), "{text}");
        assert!(text.contains("[[model]]"), "{text}");
    }

    #[test]
    fn latency_table_interpolates_between_measured_sizes() {
        let p = Profile::parse(GOOD, "good.toml").unwrap();
        let small = p.model("small").unwrap();
        assert_eq!(small.latency_table(Percentile::P50), vec![10, 18, 24, 30, 40, 50, 60, 70]);
        assert_eq!(small.latency_table(Percentile::P99), vec![13, 21, 28, 35, 49, 63, 76, 90]);
    }

    #[test]
    fn latency_table_is_forced_non_decreasing() {
        let p = Profile::parse(GOOD, "good.toml").unwrap();
        // Measured 100 µs at batch 1 and 90 µs at batch 4: the larger batch bounds the
        // smaller ones (RAMSIS's fix, from the largest size down).
        assert_eq!(p.model("big").unwrap().latency_table(Percentile::P50), vec![90, 90, 90, 90]);
    }

    #[test]
    fn latency_table_below_the_smallest_size_is_flat() {
        let m = ModelProfile {
            name: "m".into(),
            accuracy: 0.5,
            accuracy_source: String::new(),
            file: None,
            batch_sizes: vec![2, 4],
            p50_us: vec![20, 40],
            p95_us: vec![20, 40],
            p99_us: vec![20, 40],
            runs: None,
        };
        assert_eq!(m.latency_table(Percentile::P50), vec![20, 20, 30, 40]);
    }

    #[test]
    fn percentile_names() {
        assert_eq!("p95".parse::<Percentile>().unwrap(), Percentile::P95);
        assert_eq!("P50".parse::<Percentile>().unwrap(), Percentile::P50);
        assert_eq!(Percentile::P99.to_string(), "p99");
        assert_eq!(
            "p90".parse::<Percentile>().unwrap_err().to_string(),
            "unknown percentile `p90` (expected p50, p95 or p99)"
        );
        #[derive(Deserialize)]
        struct W {
            p: Percentile,
        }
        assert_eq!(toml::from_str::<W>("p = \"p99\"").unwrap().p, Percentile::P99);
    }

    #[test]
    fn golden_length_mismatch() {
        let bad = GOOD.replace("p95_us = [12, 20, 33, 80]", "p95_us = [12, 20, 33]");
        assert_eq!(err(&bad), "profiles/x.toml:13: model `small`: p95_us has 3 entries but batch_sizes has 4");
    }

    #[test]
    fn golden_version() {
        let bad = GOOD.replace("version = 1", "version = 2");
        assert_eq!(err(&bad), "profiles/x.toml:1: version 2 is not supported (this sluice reads version 1)");
        let missing = GOOD.replace("version = 1\n", "");
        assert_eq!(err(&missing), "profiles/x.toml: `version = 1` is required");
    }

    #[test]
    fn golden_unknown_field() {
        let bad = GOOD.replace("runs = 20", "runz = 20");
        assert_eq!(
            err(&bad),
            "profiles/x.toml:15: unknown field `runz`, expected one of `name`, `accuracy`, `accuracy_source`, \
             `file`, `batch_sizes`, `p50_us`, `p95_us`, `p99_us`, `runs`"
        );
    }

    #[test]
    fn golden_accuracy_out_of_range() {
        let bad = GOOD.replace("accuracy = 0.75", "accuracy = 75.0");
        assert_eq!(err(&bad), "profiles/x.toml:19: model `big`: accuracy 75 is outside [0, 1]");
    }

    #[test]
    fn golden_batch_sizes_not_increasing() {
        let bad = GOOD.replace("batch_sizes = [1, 2, 4, 8]", "batch_sizes = [1, 4, 2, 8]");
        assert_eq!(
            err(&bad),
            "profiles/x.toml:11: model `small`: batch_sizes must be strictly increasing, but 2 follows 4"
        );
    }

    #[test]
    fn golden_duplicate_name_and_percentile_order() {
        let bad = GOOD.replace("name = \"big\"", "name = \"small\"");
        assert_eq!(err(&bad), "profiles/x.toml:18: model `small`: the name is used by an earlier [[model]]");
        let bad = GOOD.replace("p99_us = [13, 21, 35, 90]", "p99_us = [13, 21, 30, 90]");
        assert_eq!(err(&bad), "profiles/x.toml:14: model `small`: at batch size 4, p99_us (30) is below p95_us (33)");
    }

    #[test]
    fn golden_wrong_type_and_syntax() {
        let bad = GOOD.replace("p50_us = [10, 18, 30, 70]", "p50_us = [10, 18, -30, 70]");
        let e = err(&bad);
        assert!(e.starts_with("profiles/x.toml:12: "), "{e}");
        assert!(e.contains("-30"), "{e}");
        let e = err("version = 1\nname = \"x\n");
        assert!(e.starts_with("profiles/x.toml:2: "), "{e}");
    }
}
