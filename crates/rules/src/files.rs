//! envoyproxy/ratelimit's configuration files, read as it reads them: one YAML document a
//! file, each a `domain` and its nested `descriptors`, refused for anything it refuses, and
//! turned into this context's rules ([`DescriptorRule`], one a node that sets a limit or a
//! leaf that sets none).
//!
//! A directory is read as envoyproxy/ratelimit reads its runtime directory: every file in it
//! and below it, by name, skipping hidden entries (a mounted ConfigMap's `..data` and
//! `..2026_...` directories, which its visible files link into). A file's rules name it, by its
//! path below the directory given (or its own name, for a file given), as their source.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_norway::Value;

use crate::{DescriptorRule, PathEntry, PathLimit, RuleId, RuleSpec, Service, Unit};

/// Every key a file may hold, at any level: envoyproxy/ratelimit checks each key of a file
/// against one set, whatever its level, and refuses the file for any other.
const KNOWN_KEYS: [&str; 16] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "quota_mode",
    "metadata",
];

/// Why a file was refused: the file, the descriptor path (as envoyproxy/ratelimit's stats keys
/// write it, `domain.key_value.key`; empty when the file as a whole is wrong) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct FileError {
    /// The file, as its rules' source names it.
    pub file: String,
    /// The descriptor path, or empty.
    pub path: String,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.file, self.reason)
        } else {
            write!(f, "{}: {}: {}", self.file, self.path, self.reason)
        }
    }
}

/// The rules a set of files holds, by domain.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FileRules {
    /// Each domain's rules, by id.
    pub domains: BTreeMap<Service, BTreeMap<RuleId, RuleSpec>>,
    /// The files read, as their rules name them.
    pub files: Vec<String>,
}

/// One file to read: its name as its rules' source names it, and where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigFile {
    /// Its name: its path below the directory given, or its own name.
    pub name: String,
    /// Where to read it.
    pub location: PathBuf,
}

/// The files `paths` name: each file as it is, each directory's files below it (by name,
/// hidden entries skipped, links followed).
///
/// # Errors
/// [`FileError`] for a path that cannot be read.
pub fn list_files(paths: &[PathBuf]) -> Result<Vec<ConfigFile>, FileError> {
    let mut files = Vec::new();
    for path in paths {
        let io = |error: std::io::Error| FileError {
            file: path.display().to_string(),
            path: String::new(),
            reason: format!("cannot be read: {error}"),
        };
        if std::fs::metadata(path).map_err(io)?.is_dir() {
            walk(path, Path::new(""), &mut files).map_err(io)?;
        } else {
            let name = path
                .file_name()
                .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
            files.push(ConfigFile { name, location: path.clone() });
        }
    }
    Ok(files)
}

fn walk(directory: &Path, below: &Path, files: &mut Vec<ConfigFile>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(directory.join(below))?.collect::<Result<_, _>>()?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let relative = below.join(&name);
        // Follows links: a ConfigMap's visible files link into its hidden data directory.
        if std::fs::metadata(entry.path())?.is_dir() {
            walk(directory, &relative, files)?;
        } else {
            files.push(ConfigFile { name: relative.display().to_string(), location: entry.path() });
        }
    }
    Ok(())
}

/// Reads and checks every file `paths` name, all or nothing.
///
/// # Errors
/// The first [`FileError`]: a path or file that cannot be read, or a file refused.
pub fn read(paths: &[PathBuf]) -> Result<FileRules, FileError> {
    let mut texts = Vec::new();
    for file in list_files(paths)? {
        let text = std::fs::read_to_string(&file.location).map_err(|error| FileError {
            file: file.name.clone(),
            path: String::new(),
            reason: format!("cannot be read: {error}"),
        })?;
        texts.push((file.name, text));
    }
    parse(&texts)
}

/// Checks files given as (name, text), all or nothing: a domain in two files is refused, as
/// envoyproxy/ratelimit refuses it.
///
/// # Errors
/// The first [`FileError`].
pub fn parse(files: &[(String, String)]) -> Result<FileRules, FileError> {
    let mut rules = FileRules::default();
    let mut domain_files: BTreeMap<Service, String> = BTreeMap::new();
    for (name, text) in files {
        let (service, file_rules) = parse_file(name, text)?;
        if let Some(first) = domain_files.insert(service.clone(), name.clone()) {
            return Err(FileError {
                file: name.clone(),
                path: service.to_string(),
                reason: format!("duplicate domain '{service}' in config file (also in {first})"),
            });
        }
        let mut by_id = BTreeMap::new();
        for rule in file_rules {
            let id = RuleId::for_descriptor(&rule.service, &rule.path);
            let path = rule.stats_key();
            let spec = RuleSpec::from_descriptor(rule).map_err(|invalid| FileError {
                file: name.clone(),
                path,
                reason: invalid.reason.to_owned(),
            })?;
            by_id.insert(id, spec);
        }
        rules.domains.insert(service, by_id);
        rules.files.push(name.clone());
    }
    Ok(rules)
}

/// Checks one file: its domain, and a rule for each node that sets a limit and each leaf that
/// sets none.
///
/// # Errors
/// [`FileError`] naming `name` and the descriptor path.
pub fn parse_file(name: &str, text: &str) -> Result<(Service, Vec<DescriptorRule>), FileError> {
    let refuse =
        |path: &str, reason: String| FileError { file: name.to_owned(), path: path.to_owned(), reason };
    // One document, as envoyproxy/ratelimit's YAML decoder reads the first.
    let document = serde_norway::Deserializer::from_str(text)
        .next()
        .map(<Value as serde::Deserialize>::deserialize)
        .transpose()
        .map_err(|error| refuse("", format!("error loading config file: {error}")))?
        .unwrap_or(Value::Null);
    check_keys(&document, "").map_err(|(path, reason)| refuse(&path, reason))?;
    let root = match &document {
        Value::Mapping(root) => root,
        Value::Null => return Err(refuse("", "config file cannot have empty domain".into())),
        _ => return Err(refuse("", "error loading config file: the document is not a mapping".into())),
    };
    let domain = match root.get("domain") {
        Some(Value::String(domain)) if !domain.is_empty() => domain.clone(),
        None | Some(Value::Null) => return Err(refuse("", "config file cannot have empty domain".into())),
        Some(Value::String(_)) => return Err(refuse("", "config file cannot have empty domain".into())),
        Some(_) => return Err(refuse("", "error loading config file: domain is not a string".into())),
    };
    let service = Service::parse(&domain)
        .map_err(|invalid| refuse(&domain, format!("invalid domain: {}", invalid.reason)))?;
    let mut rules = Vec::new();
    let descriptors = list(root.get("descriptors"), &domain).map_err(|reason| refuse(&domain, reason))?;
    let mut reader = Reader { service: &service, source: name, rules: &mut rules };
    reader.descriptors(&domain, &[], descriptors).map_err(|(path, reason)| refuse(&path, reason))?;
    Ok((service, rules))
}

/// Refuses any key outside [`KNOWN_KEYS`], at any level (metadata's own content aside, which is
/// the writer's), and any number that is not whole, as envoyproxy/ratelimit's check of a file
/// does; the error names the descriptor the key is in (`parent` is the one above).
fn check_keys(value: &Value, parent: &str) -> Result<(), (String, String)> {
    match value {
        Value::Mapping(mapping) => {
            let text = |field: &str| match mapping.get(field) {
                Some(Value::String(text)) => Some(text.clone()),
                Some(Value::Number(number)) => Some(number.to_string()),
                _ => None,
            };
            let here = match (text("domain"), text("key")) {
                (Some(domain), _) => domain,
                (None, Some(key)) => match text("value").filter(|value| !value.is_empty()) {
                    Some(value) => format!("{parent}.{key}_{value}"),
                    None => format!("{parent}.{key}"),
                },
                (None, None) => parent.to_owned(),
            };
            for (key, inner) in mapping {
                let Value::String(key) = key else {
                    return Err((here, format!("config error, key is not of type string: {key:?}")));
                };
                if !KNOWN_KEYS.contains(&key.as_str()) {
                    return Err((here, format!("config error, unknown key '{key}'")));
                }
                if key != "metadata" {
                    check_keys(inner, &here)?;
                }
            }
            Ok(())
        }
        Value::Sequence(items) => {
            for item in items {
                if !matches!(item, Value::Mapping(_)) {
                    return Err((
                        parent.to_owned(),
                        format!("config error, yaml file contains list of type other than map: {item:?}"),
                    ));
                }
                check_keys(item, parent)?;
            }
            Ok(())
        }
        Value::Number(number) if number.is_f64() => {
            Err((parent.to_owned(), format!("error checking config: {number} is not a whole number")))
        }
        _ => Ok(()),
    }
}

/// A list field: absent or null is empty.
fn list<'v>(value: Option<&'v Value>, field: &str) -> Result<&'v [Value], String> {
    match value {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Sequence(items)) => Ok(items),
        Some(_) => Err(format!("error loading config file: {field} is not a list")),
    }
}

fn text_field(mapping: &serde_norway::Mapping, field: &str) -> Result<Option<String>, String> {
    match mapping.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        // YAML reads `value: 200` as a number; Go's decoder reads it into a string field as
        // its text, and so does this.
        Some(Value::Number(number)) => Ok(Some(number.to_string())),
        Some(Value::Bool(flag)) => Ok(Some(flag.to_string())),
        Some(_) => Err(format!("error loading config file: {field} is not a string")),
    }
}

fn flag_field(mapping: &serde_norway::Mapping, field: &str) -> Result<bool, String> {
    match mapping.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(flag)) => Ok(*flag),
        Some(_) => Err(format!("error loading config file: {field} is not a boolean")),
    }
}

struct Reader<'a> {
    service: &'a Service,
    source: &'a str,
    rules: &'a mut Vec<DescriptorRule>,
}

impl Reader<'_> {
    /// One level's descriptors, below `parent` (a stats key) at `above`.
    fn descriptors(
        &mut self,
        parent: &str,
        above: &[PathEntry],
        items: &[Value],
    ) -> Result<(), (String, String)> {
        let mut seen: HashSet<String> = HashSet::new();
        for (order, item) in items.iter().enumerate() {
            let Value::Mapping(node) = item else {
                return Err((
                    parent.to_owned(),
                    "error loading config file: a descriptor is not a mapping".into(),
                ));
            };
            let fail = |path: &str, reason: String| (path.to_owned(), reason);
            let key = text_field(node, "key").map_err(|reason| fail(parent, reason))?.unwrap_or_default();
            if key.is_empty() {
                return Err(fail(parent, "descriptor has empty key".into()));
            }
            let value = text_field(node, "value")
                .map_err(|reason| fail(parent, reason))?
                .filter(|value| !value.is_empty());
            let composite = match &value {
                Some(value) => format!("{key}_{value}"),
                None => key.clone(),
            };
            let here = format!("{parent}.{composite}");
            if !seen.insert(composite) {
                return Err(fail(&here, format!("duplicate descriptor composite key '{here}'")));
            }
            let share_threshold =
                flag_field(node, "share_threshold").map_err(|reason| fail(&here, reason))?;
            let entry = PathEntry {
                key: Arc::from(key.as_str()),
                value: value.as_deref().map(Arc::from),
                share_threshold,
                order: u32::try_from(order).unwrap_or(u32::MAX),
            };
            if share_threshold && !entry.is_wildcard() {
                return Err(fail(&here, "share_threshold can only be used with wildcard values".into()));
            }
            let mut path = above.to_vec();
            path.push(entry);
            if path.len() > crate::MAX_DEPTH {
                return Err(fail(
                    &here,
                    format!("a descriptor path has at most {} levels", crate::MAX_DEPTH),
                ));
            }
            let children =
                list(node.get("descriptors"), "descriptors").map_err(|reason| fail(&here, reason))?;
            let shadow_mode = flag_field(node, "shadow_mode").map_err(|reason| fail(&here, reason))?;
            let quota_mode = flag_field(node, "quota_mode").map_err(|reason| fail(&here, reason))?;
            let detailed_metric =
                flag_field(node, "detailed_metric").map_err(|reason| fail(&here, reason))?;
            let value_to_metric =
                flag_field(node, "value_to_metric").map_err(|reason| fail(&here, reason))?;
            let mut rule = DescriptorRule {
                service: self.service.clone(),
                path: path.clone(),
                limit: PathLimit::Unset,
                name: None,
                replaces: Vec::new(),
                shadow_mode,
                quota_mode,
                detailed_metric,
                value_to_metric,
                source: self.source.to_owned(),
            };
            match node.get("rate_limit") {
                None | Some(Value::Null) => {}
                Some(Value::Mapping(limit)) => {
                    read_limit(limit, &mut rule).map_err(|reason| fail(&here, reason))?;
                }
                Some(_) => {
                    return Err(fail(&here, "error loading config file: rate_limit is not a mapping".into()))
                }
            }
            // A node that sets a limit is a rule; so is a leaf that sets none ("no limit here",
            // which ends the walk). A node between the two is implied by its children's paths.
            if rule.limit != PathLimit::Unset || children.is_empty() {
                rule.validate().map_err(|invalid| fail(&here, invalid.reason.to_owned()))?;
                self.rules.push(rule);
            }
            self.descriptors(&here, &path, children)?;
        }
        Ok(())
    }
}

/// A node's `rate_limit` block.
fn read_limit(limit: &serde_norway::Mapping, rule: &mut DescriptorRule) -> Result<(), String> {
    let unlimited = flag_field(limit, "unlimited")?;
    let unit_text = text_field(limit, "unit")?.unwrap_or_default();
    let unit = Unit::parse(&unit_text);
    let requests_per_unit = match limit.get("requests_per_unit") {
        None | Some(Value::Null) => 0,
        Some(Value::Number(number)) => {
            number.as_u64().and_then(|count| u32::try_from(count).ok()).ok_or_else(|| {
                format!(
                    "error loading config file: requests_per_unit {number} is not a 32-bit unsigned integer"
                )
            })?
        }
        Some(_) => return Err("error loading config file: requests_per_unit is not a number".into()),
    };
    rule.limit = match (unlimited, unit) {
        (true, Some(_)) => return Err("should not specify rate limit unit when unlimited".into()),
        (true, None) => PathLimit::Unlimited,
        (false, Some(unit)) => PathLimit::PerUnit { requests_per_unit, unit },
        (false, None) => return Err(format!("invalid rate limit unit '{unit_text}'")),
    };
    rule.name = text_field(limit, "name")?.filter(|name| !name.is_empty());
    for replaced in list(limit.get("replaces"), "replaces")? {
        let Value::Mapping(replaced) = replaced else {
            return Err("error loading config file: a replaces entry is not a mapping".into());
        };
        let name = text_field(replaced, "name")?.unwrap_or_default();
        if name.is_empty() {
            return Err("should not have an empty replaces entry".into());
        }
        if rule.name.as_deref() == Some(name.as_str()) {
            return Err("replaces should not contain name of same descriptor".into());
        }
        rule.replaces.push(name);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
