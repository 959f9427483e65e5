//! Catalog as code: reading Zone and Cluster documents from YAML and JSON files,
//! validating every one of them with the model's own rules before anything is
//! written, and planning what `meshcat apply` does against what the API stores.
//! No I/O beyond reading the files: the plan is computed from the API's records.
//!
//! A document is `{"kind": "Zone" | "Cluster", ...record fields as in the API}`. A
//! YAML file may hold several documents (`---`), a JSON file one object or an array;
//! a directory stands for its `.yaml`, `.yml` and `.json` files (not its
//! subdirectories), read in name order.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use meshcat_common::model::{ClusterRecord, ZoneRecord};
use meshcat_common::validate;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Largest catalog file read.
pub const MAX_FILE: u64 = 16 << 20;
/// Most documents in one apply.
pub const MAX_DOCUMENTS: usize = 100_000;
/// Most files in one apply (directories expanded).
pub const MAX_FILES: usize = 10_000;

/// What a document registers.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    Zone(ZoneRecord),
    Cluster(Box<ClusterRecord>),
}

impl Record {
    /// `zone/<z>` or `cluster/<z>/<c>`, as apply prints it.
    pub fn name(&self) -> String {
        match self {
            Record::Zone(z) => zone_name(&z.zone_name),
            Record::Cluster(c) => cluster_name(&c.zone_name, &c.cluster_name),
        }
    }
}

pub fn zone_name(zone: &str) -> String {
    format!("zone/{zone}")
}

pub fn cluster_name(zone: &str, cluster: &str) -> String {
    format!("cluster/{zone}/{cluster}")
}

/// Where a document came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub file: String,
    /// 1-based position in its file (empty YAML documents count too).
    pub document: usize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: document {}", self.file, self.document)
    }
}

/// One valid document.
#[derive(Debug, Clone)]
pub struct Document {
    pub origin: Origin,
    pub record: Record,
}

/// Why a file or a document cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: String,
    pub document: Option<usize>,
    /// `zone/<z>` or `cluster/<z>/<c>`, when known.
    pub record: Option<String>,
    pub why: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(d) = self.document {
            write!(f, ": document {d}")?;
        }
        if let Some(r) = &self.record {
            write!(f, " ({r})")?;
        }
        write!(f, ": {}", self.why)
    }
}

fn file_problem(file: &str, why: impl Into<String>) -> Problem {
    Problem {
        file: file.to_owned(),
        document: None,
        record: None,
        why: why.into(),
    }
}

/// Reads every document of `paths`; every problem found, or none.
pub fn load(paths: &[PathBuf]) -> Result<Vec<Document>, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut files = Vec::new();
    for p in paths {
        match expand(p) {
            Ok(mut f) => files.append(&mut f),
            Err(e) => problems.push(e),
        }
    }
    if files.len() > MAX_FILES {
        return Err(vec![file_problem(
            "-f",
            format!("more than {MAX_FILES} files"),
        )]);
    }
    let mut docs = Vec::new();
    for f in &files {
        let name = f.display().to_string();
        let text = match read(f) {
            Ok(t) => t,
            Err(why) => {
                problems.push(file_problem(&name, why));
                continue;
            }
        };
        match parse_file(&name, &text, is_json(f)) {
            Ok(values) => {
                for (i, v) in values {
                    let origin = Origin {
                        file: name.clone(),
                        document: i,
                    };
                    match document(v) {
                        Ok(record) => docs.push(Document { origin, record }),
                        Err((record, why)) => problems.push(Problem {
                            file: name.clone(),
                            document: Some(i),
                            record,
                            why,
                        }),
                    }
                }
            }
            Err(p) => problems.push(p),
        }
        if docs.len() > MAX_DOCUMENTS {
            return Err(vec![file_problem(
                &name,
                format!("more than {MAX_DOCUMENTS} documents in all"),
            )]);
        }
    }
    problems.extend(duplicates(&docs));
    if problems.is_empty() && docs.is_empty() {
        problems.push(file_problem(
            &paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            "no Zone or Cluster document found",
        ));
    }
    if problems.is_empty() {
        Ok(docs)
    } else {
        Err(problems)
    }
}

/// A path given to `-f`: itself, or a directory's catalog files in name order.
fn expand(p: &Path) -> Result<Vec<PathBuf>, Problem> {
    let name = p.display().to_string();
    if p == Path::new("-") {
        return Ok(vec![p.to_owned()]);
    }
    let meta = std::fs::metadata(p).map_err(|e| file_problem(&name, e.to_string()))?;
    if !meta.is_dir() {
        return Ok(vec![p.to_owned()]);
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(p).map_err(|e| file_problem(&name, e.to_string()))? {
        let path = entry
            .map_err(|e| file_problem(&name, e.to_string()))?
            .path();
        let catalog = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        );
        if catalog && path.is_file() {
            out.push(path);
        }
        if out.len() > MAX_FILES {
            break;
        }
    }
    out.sort();
    Ok(out)
}

fn is_json(p: &Path) -> bool {
    p.extension().and_then(|e| e.to_str()) == Some("json")
}

/// A file's text, at most [`MAX_FILE`] bytes; `-` is standard input. Also what
/// `meshcat inject` reads its file with.
pub fn read(p: &Path) -> Result<String, String> {
    let mut bytes = Vec::new();
    let limited = |r: &mut dyn Read, bytes: &mut Vec<u8>| {
        r.take(MAX_FILE + 1)
            .read_to_end(bytes)
            .map_err(|e| e.to_string())
    };
    if p == Path::new("-") {
        limited(&mut std::io::stdin().lock(), &mut bytes)?;
    } else {
        let meta = std::fs::metadata(p).map_err(|e| e.to_string())?;
        if !meta.is_file() {
            return Err("not a regular file".into());
        }
        let mut f = std::fs::File::open(p).map_err(|e| e.to_string())?;
        limited(&mut f, &mut bytes)?;
    }
    if bytes.len() as u64 > MAX_FILE {
        return Err(format!("larger than {} MiB", MAX_FILE >> 20));
    }
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned())
}

/// The documents of a file with their 1-based positions. Empty YAML documents
/// (nothing, only comments or `null` between two `---`) are skipped and not counted
/// (serde-saphyr leaves them out): "document N" is the Nth that holds something.
pub fn parse_file(name: &str, text: &str, json: bool) -> Result<Vec<(usize, Value)>, Problem> {
    if json {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| file_problem(name, format!("not valid JSON: {e}")))?;
        return Ok(match v {
            Value::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| (i + 1, v))
                .collect(),
            v => vec![(1, v)],
        });
    }
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)
        .map_err(|e| file_problem(name, format!("not valid YAML: {}", yaml_error(&e))))?;
    Ok(docs
        .into_iter()
        .enumerate()
        .map(|(i, v)| (i + 1, v))
        .collect())
}

/// What a YAML error says, in one line: where and what (the rest of serde-saphyr's
/// text is a drawing of the input's line, left out), without control characters.
pub fn yaml_error(e: &serde_saphyr::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("");
    crate::render::printable(first.trim_start_matches("error: "))
}

/// The field names of a record as the API spells them.
fn field_names<T: serde::Serialize>(sample: &T) -> BTreeSet<String> {
    match serde_json::to_value(sample) {
        Ok(Value::Object(m)) => m.into_iter().map(|(k, _)| k).collect(),
        _ => BTreeSet::new(),
    }
}

fn sample_zone() -> ZoneRecord {
    ZoneRecord::new("", "")
}

/// One document as a record, checked by the model's own rules. The error names the
/// record when it has a name, and says why.
pub fn document(v: Value) -> Result<Record, (Option<String>, String)> {
    let Value::Object(mut m) = v else {
        return Err((
            None,
            "a document must be a mapping with kind: Zone or kind: Cluster".into(),
        ));
    };
    let kind = match m.remove("kind") {
        Some(Value::String(k)) => k,
        Some(other) => return Err((None, format!("kind must be Zone or Cluster, not {other}"))),
        None => {
            return Err((
                None,
                "no kind: each document needs kind: Zone or kind: Cluster".into(),
            ));
        }
    };
    let text = |key: &str| m.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
    match kind.as_str() {
        "Zone" => {
            let name = Some(zone_name(&text("zoneName")));
            let z: ZoneRecord = typed(
                m,
                &field_names(&sample_zone()),
                &["zoneName", "serverAddress"],
            )
            .map_err(|why| (name.clone(), why))?;
            validate::zone(&z).map_err(|e| (name, e.0))?;
            Ok(Record::Zone(z))
        }
        "Cluster" => {
            let name = Some(cluster_name(&text("zoneName"), &text("clusterName")));
            let c: ClusterRecord = typed(
                m,
                &field_names(&ClusterRecord::new("", "", "")),
                &["clusterName", "zoneName", "name"],
            )
            .map_err(|why| (name.clone(), why))?;
            validate::cluster(&c).map_err(|e| (name, e.0))?;
            Ok(Record::Cluster(Box::new(c)))
        }
        other => Err((None, format!("kind must be Zone or Cluster, not {other:?}"))),
    }
}

/// The record of a document's fields. Unknown fields are refused (a misspelt field
/// would otherwise be dropped without a word), and a field of the wrong type is
/// named: serde's own error does not say which field it was.
fn typed<T: DeserializeOwned>(
    m: Map<String, Value>,
    known: &BTreeSet<String>,
    required: &[&str],
) -> Result<T, String> {
    if let Some(unknown) = m.keys().find(|k| !known.contains(*k)) {
        return Err(format!("unknown field {unknown:?}"));
    }
    if let Some(missing) = required.iter().find(|k| !m.contains_key(**k)) {
        return Err(format!("{missing} is required"));
    }
    serde_json::from_value(Value::Object(m.clone())).map_err(|e| {
        // Find the field: the required fields alone parse, so the first field that
        // breaks them is the one.
        let base: Map<String, Value> = required
            .iter()
            .filter_map(|k| m.get(*k).map(|v| ((*k).to_owned(), v.clone())))
            .collect();
        for (k, v) in &m {
            let mut one = base.clone();
            one.insert(k.clone(), v.clone());
            if let Err(e) = serde_json::from_value::<T>(Value::Object(one)) {
                return format!("field {k}: {e}");
            }
        }
        e.to_string()
    })
}

/// Records named twice.
fn duplicates(docs: &[Document]) -> Vec<Problem> {
    let mut seen: BTreeMap<String, &Origin> = BTreeMap::new();
    let mut out = Vec::new();
    for d in docs {
        let name = d.record.name();
        if let Some(first) = seen.get(&name) {
            out.push(Problem {
                file: d.origin.file.clone(),
                document: Some(d.origin.document),
                record: Some(name),
                why: format!("also defined in {first}"),
            });
        } else {
            seen.insert(name, &d.origin);
        }
    }
    out
}

/// What the files want.
#[derive(Debug, Clone, Default)]
pub struct Desired {
    pub zones: BTreeMap<String, ZoneRecord>,
    pub clusters: BTreeMap<(String, String), (ClusterRecord, Origin)>,
}

impl Desired {
    pub fn new(docs: Vec<Document>) -> Desired {
        let mut d = Desired::default();
        for doc in docs {
            match doc.record {
                Record::Zone(z) => {
                    d.zones.insert(z.zone_name.clone(), z);
                }
                Record::Cluster(c) => {
                    d.clusters.insert(
                        (c.zone_name.clone(), c.cluster_name.clone()),
                        (*c, doc.origin),
                    );
                }
            }
        }
        d
    }

    /// Every zone the files name: by a Zone document or as a cluster's zone.
    pub fn zone_names(&self) -> BTreeSet<String> {
        self.zones
            .keys()
            .cloned()
            .chain(self.clusters.keys().map(|(z, _)| z.clone()))
            .collect()
    }
}

/// What the API stores of the zones the files name.
#[derive(Debug, Clone, Default)]
pub struct Current {
    pub zones: BTreeMap<String, ZoneRecord>,
    pub clusters: BTreeMap<(String, String), ClusterRecord>,
}

/// What apply does to one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Created,
    Updated,
    Unchanged,
    Deleted,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Created => "created",
            Action::Updated => "updated",
            Action::Unchanged => "unchanged",
            Action::Deleted => "deleted",
        }
    }
}

/// The writes of an apply, in the order they are made: zones first, then clusters
/// created, replaced and left as they are, then clusters deleted (before any zone
/// could be).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub zones: Vec<(Action, ZoneRecord)>,
    pub create: Vec<ClusterRecord>,
    pub update: Vec<ClusterRecord>,
    pub unchanged: Vec<ClusterRecord>,
    /// (zone, cluster)
    pub delete: Vec<(String, String)>,
}

impl Plan {
    /// The lines apply prints, in the order of the writes.
    pub fn lines(&self) -> Vec<(Action, String)> {
        let mut out: Vec<(Action, String)> = self
            .zones
            .iter()
            .map(|(a, z)| (*a, zone_name(&z.zone_name)))
            .collect();
        for (a, list) in [
            (Action::Created, &self.create),
            (Action::Updated, &self.update),
            (Action::Unchanged, &self.unchanged),
        ] {
            out.extend(
                list.iter()
                    .map(|c| (a, cluster_name(&c.zone_name, &c.cluster_name))),
            );
        }
        out.extend(
            self.delete
                .iter()
                .map(|(z, c)| (Action::Deleted, cluster_name(z, c))),
        );
        out
    }
}

/// Compares the files with the API's records (both with their defaults applied, so
/// equal means equal as stored) and plans the writes: a zone or a cluster is
/// created when missing, replaced when it differs, left alone when equal. Refuses,
/// before anything is written, a cluster whose zone is neither in the files nor
/// registered.
pub fn plan(desired: &Desired, current: &Current, prune: bool) -> Result<Plan, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut plan = Plan::default();
    for (name, z) in &desired.zones {
        let action = match current.zones.get(name) {
            None => Action::Created,
            Some(stored) if stored == z => Action::Unchanged,
            Some(_) => Action::Updated,
        };
        plan.zones.push((action, z.clone()));
    }
    for ((zone, cluster), (c, origin)) in &desired.clusters {
        if !desired.zones.contains_key(zone) && !current.zones.contains_key(zone) {
            problems.push(Problem {
                file: origin.file.clone(),
                document: Some(origin.document),
                record: Some(cluster_name(zone, cluster)),
                why: format!("zone {zone} is neither registered nor in the files"),
            });
            continue;
        }
        match current.clusters.get(&(zone.clone(), cluster.clone())) {
            None => plan.create.push(c.clone()),
            Some(stored) if stored == c => plan.unchanged.push(c.clone()),
            Some(_) => plan.update.push(c.clone()),
        }
    }
    if prune {
        let named = desired.zone_names();
        plan.delete = current
            .clusters
            .keys()
            .filter(|(z, _)| named.contains(z))
            .filter(|k| !desired.clusters.contains_key(*k))
            .cloned()
            .collect();
    }
    if problems.is_empty() {
        Ok(plan)
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docs(text: &str) -> Result<Vec<Record>, Vec<String>> {
        let values = parse_file("f.yaml", text, false).map_err(|p| vec![p.to_string()])?;
        let mut out = Vec::new();
        let mut errs = Vec::new();
        for (i, v) in values {
            match document(v) {
                Ok(r) => out.push(r),
                Err((r, why)) => errs.push(format!("{i} {r:?} {why}")),
            }
        }
        if errs.is_empty() { Ok(out) } else { Err(errs) }
    }

    #[test]
    fn yaml_documents_become_records_with_defaults() {
        let r = docs(
            "kind: Zone\nzoneName: z\nserverAddress: cp:1\n---\n---\nkind: Cluster\nzoneName: z\nclusterName: c\nname: C\nowner: team\nminInstances: 2\ndependencies: [d, other/e]\n",
        )
        .unwrap();
        let Record::Zone(z) = &r[0] else { panic!() };
        assert_eq!(
            (z.zone_name.as_str(), z.request_cluster.as_str()),
            ("z", "")
        );
        let Record::Cluster(c) = &r[1] else { panic!() };
        let mut want = ClusterRecord::new("z", "c", "C");
        want.owner = "team".into();
        want.min_instances = 2;
        want.dependencies = vec!["d".into(), "other/e".into()];
        assert_eq!(**c, want);
    }

    #[test]
    fn empty_yaml_documents_are_not_counted() {
        let v = parse_file(
            "f.yaml",
            "kind: Zone\n---\n# gone\n---\nkind: Cluster\n---\nnull\n---\nkind: X\n",
            false,
        )
        .unwrap();
        let at: Vec<(usize, &str)> = v
            .iter()
            .map(|(i, d)| (*i, d["kind"].as_str().unwrap()))
            .collect();
        assert_eq!(at, [(1, "Zone"), (2, "Cluster"), (3, "X")]);
    }

    #[test]
    fn json_arrays_hold_several_documents() {
        let v = parse_file(
            "f.json",
            r#"[{"kind":"Zone","zoneName":"z","serverAddress":"cp:1"},{"kind":"Cluster","zoneName":"z","clusterName":"c","name":"C"}]"#,
            true,
        )
        .unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[1].0, 2);
    }

    #[test]
    fn bad_documents_say_which_and_why() {
        let errs = docs(
            "kind: Cluster\nzoneName: z\nclusterName: c\nname: C\nminInstances: -1\n---\nkind: Cluster\nzoneName: z\nclusterName: d\nname: D\nownr: x\n---\nkind: Service\n---\nzoneName: z\n---\nkind: Cluster\nzoneName: z\nclusterName: e\nname: E\nversion: [1]\n---\nkind: Cluster\nzoneName: z\nclusterName: f\n",
        )
        .unwrap_err();
        assert_eq!(errs.len(), 6, "{errs:#?}");
        assert!(
            errs[0].starts_with("1 Some(\"cluster/z/c\") minInstances must be 0 or more"),
            "{}",
            errs[0]
        );
        assert!(errs[1].contains("unknown field \"ownr\""), "{}", errs[1]);
        assert!(
            errs[2].contains("kind must be Zone or Cluster, not \"Service\""),
            "{}",
            errs[2]
        );
        assert!(errs[3].contains("no kind"), "{}", errs[3]);
        assert!(
            errs[4].starts_with("5 ") && errs[4].contains("field version: invalid type"),
            "{}",
            errs[4]
        );
        assert!(errs[5].contains("name is required"), "{}", errs[5]);
        let e = parse_file("f.yaml", "kind: [", false).unwrap_err();
        assert!(e.to_string().starts_with("f.yaml: not valid YAML"), "{e}");
    }

    fn zone(name: &str, address: &str) -> ZoneRecord {
        ZoneRecord {
            zone_name: name.into(),
            server_address: address.into(),
            ..sample_zone()
        }
    }

    fn origin(n: usize) -> Origin {
        Origin {
            file: "f.yaml".into(),
            document: n,
        }
    }

    fn desired(zones: &[ZoneRecord], clusters: &[ClusterRecord]) -> Desired {
        let mut docs: Vec<Document> = zones
            .iter()
            .map(|z| Document {
                origin: origin(1),
                record: Record::Zone(z.clone()),
            })
            .collect();
        docs.extend(clusters.iter().enumerate().map(|(i, c)| Document {
            origin: origin(i + 2),
            record: Record::Cluster(Box::new(c.clone())),
        }));
        Desired::new(docs)
    }

    #[test]
    fn plans_create_update_keep_and_prune() {
        let mut b2 = ClusterRecord::new("z", "b", "B");
        b2.owner = "new-team".into();
        let want = desired(
            &[zone("z", "cp:1"), zone("new", "cp:2")],
            &[
                ClusterRecord::new("z", "a", "A"),
                b2.clone(),
                ClusterRecord::new("new", "n", "N"),
            ],
        );
        let mut current = Current::default();
        current.zones.insert("z".into(), zone("z", "cp:1"));
        current
            .zones
            .insert("untouched".into(), zone("untouched", "cp:3"));
        for c in [
            ClusterRecord::new("z", "a", "A"),
            ClusterRecord::new("z", "b", "B"),
            ClusterRecord::new("z", "gone", "G"),
            ClusterRecord::new("untouched", "x", "X"),
        ] {
            current
                .clusters
                .insert((c.zone_name.clone(), c.cluster_name.clone()), c);
        }
        let p = plan(&want, &current, true).unwrap();
        let lines: Vec<String> = p
            .lines()
            .into_iter()
            .map(|(a, n)| format!("{} {n}", a.as_str()))
            .collect();
        assert_eq!(
            lines,
            [
                "created zone/new",
                "unchanged zone/z",
                "created cluster/new/n",
                "updated cluster/z/b",
                "unchanged cluster/z/a",
                "deleted cluster/z/gone",
            ]
        );
        let keep = plan(&want, &current, false).unwrap();
        assert!(keep.delete.is_empty());
        // Applied, the same files plan nothing but unchanged lines.
        let mut after = current.clone();
        after.zones.insert("new".into(), zone("new", "cp:2"));
        after.clusters.remove(&("z".into(), "gone".into()));
        for c in [ClusterRecord::new("new", "n", "N"), b2] {
            after
                .clusters
                .insert((c.zone_name.clone(), c.cluster_name.clone()), c);
        }
        let again = plan(&want, &after, true).unwrap();
        assert!(
            again.lines().iter().all(|(a, _)| *a == Action::Unchanged),
            "{:?}",
            again.lines()
        );
    }

    #[test]
    fn a_changed_zone_is_updated_and_a_missing_zone_refused() {
        let want = desired(&[zone("z", "cp:9")], &[ClusterRecord::new("z", "a", "A")]);
        let mut current = Current::default();
        current.zones.insert("z".into(), zone("z", "cp:1"));
        let p = plan(&want, &current, false).unwrap();
        assert_eq!(p.zones, [(Action::Updated, zone("z", "cp:9"))]);
        assert_eq!(
            p.lines()[0],
            (Action::Updated, "zone/z".to_owned()),
            "zones first"
        );
        let want = desired(&[], &[ClusterRecord::new("nowhere", "a", "A")]);
        let problems = plan(&want, &current, false).unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0]
                .to_string()
                .contains("zone nowhere is neither registered nor in the files"),
            "{}",
            problems[0]
        );
    }

    #[test]
    fn a_record_twice_is_refused() {
        let d = |n| Document {
            origin: origin(n),
            record: Record::Cluster(Box::new(ClusterRecord::new("z", "a", "A"))),
        };
        let p = duplicates(&[d(1), d(3)]);
        assert_eq!(p.len(), 1);
        assert_eq!(
            p[0].to_string(),
            "f.yaml: document 3 (cluster/z/a): also defined in f.yaml: document 1"
        );
    }
}
