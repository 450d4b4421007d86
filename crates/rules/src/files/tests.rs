use chrono::Utc;

use super::*;
use crate::{Actor, Rule, Snapshot, Version};

fn snapshot_of(files: &[(&str, &str)]) -> Snapshot {
    let files: Vec<(String, String)> =
        files.iter().map(|(name, text)| ((*name).to_owned(), (*text).to_owned())).collect();
    let read = parse(&files).unwrap();
    let rules = read
        .domains
        .into_values()
        .flatten()
        .map(|(id, spec)| Rule {
            id,
            spec,
            version: Version::new(1).unwrap(),
            created_by: Actor::new("test").unwrap(),
            updated_at: Utc::now(),
        })
        .collect();
    Snapshot::compile(1, rules)
}

/// What the walk finds for a descriptor: the limit's path and its limit.
fn walked(snapshot: &Snapshot, domain: &str, entries: &[(&str, &str)]) -> Option<(String, PathLimit)> {
    let (_, rule) = snapshot.walk(domain, entries)?;
    let descriptor = rule.spec.descriptor().unwrap();
    Some((descriptor.stats_key(), descriptor.limit))
}

fn per(requests_per_unit: u32, unit: Unit) -> PathLimit {
    PathLimit::PerUnit { requests_per_unit, unit }
}

const MESSAGING: &str = "
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: Day
      requests_per_unit: 100
";

#[test]
fn a_descriptor_matches_a_path_entry_by_entry_to_its_full_depth() {
    let snapshot = snapshot_of(&[("messaging.yaml", MESSAGING)]);
    let marketing =
        walked(&snapshot, "messaging", &[("message_type", "marketing"), ("to_number", "2061111111")]);
    assert_eq!(marketing, Some(("messaging.message_type_marketing.to_number".into(), per(5, Unit::Day))));
    assert_eq!(
        walked(&snapshot, "messaging", &[("to_number", "2061111111")]),
        Some(("messaging.to_number".into(), per(100, Unit::Day)))
    );
    // The placeholder node sets no limit; a descriptor that stops there, or goes on past a
    // leaf, or names another value, matches nothing.
    assert_eq!(walked(&snapshot, "messaging", &[("message_type", "marketing")]), None);
    assert_eq!(walked(&snapshot, "messaging", &[("to_number", "1"), ("extra", "x")]), None);
    assert_eq!(
        walked(&snapshot, "messaging", &[("message_type", "transactional"), ("to_number", "1")]),
        None
    );
    assert_eq!(walked(&snapshot, "other", &[("to_number", "1")]), None);
}

#[test]
fn the_walk_tries_the_exact_value_then_wildcards_in_the_files_order_then_the_key_alone_and_never_backtracks()
{
    let snapshot = snapshot_of(&[(
        "walk.yaml",
        "
domain: walk
descriptors:
  - key: path
    value: /api/*/users/*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: /api/v1/users/me
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: user
    value: banned
  - key: user
    descriptors:
      - key: action
        rate_limit: {unit: minute, requests_per_unit: 9}
",
    )]);
    let limit = |entries: &[(&str, &str)]| walked(&snapshot, "walk", entries).map(|(_, limit)| limit);
    assert_eq!(limit(&[("path", "/api/v1/users/me")]), Some(per(1, Unit::Second)));
    assert_eq!(limit(&[("path", "/api/v2/users/you")]), Some(per(3, Unit::Second)));
    assert_eq!(limit(&[("path", "/api/v2/groups")]), Some(per(2, Unit::Second)));
    assert_eq!(limit(&[("path", "/health")]), Some(per(4, Unit::Second)));
    // A leaf without a limit stops the walk: that user has none, not the key's.
    assert_eq!(walked(&snapshot, "walk", &[("user", "banned")]).unwrap().1, PathLimit::Unset);
    assert_eq!(limit(&[("user", "banned"), ("action", "post")]), None, "no backtracking to `user`");
    assert_eq!(limit(&[("user", "alice"), ("action", "post")]), Some(per(9, Unit::Minute)));
    assert_eq!(limit(&[("user", "alice")]), None, "the key alone sets no limit at its own depth");
}

#[test]
fn a_wildcard_matches_any_run_of_characters_anywhere_any_number_of_times() {
    assert!(crate::wildcard_matches("*", ""));
    assert!(crate::wildcard_matches("foo*", "foobar"));
    assert!(crate::wildcard_matches("*bar", "foobar"));
    assert!(crate::wildcard_matches("f*o*r", "foobar"));
    assert!(crate::wildcard_matches("a*b*c", "abc"));
    assert!(!crate::wildcard_matches("a*b*c", "acb"));
    assert!(!crate::wildcard_matches("foo*", "fo"));
    assert!(!crate::wildcard_matches("ab*ba", "aba"), "the two ends may not overlap");
    assert!(crate::wildcard_matches("exact", "exact"));
    assert!(!crate::wildcard_matches("exact", "exactly"));
}

#[test]
fn the_same_files_give_the_same_rule_ids_and_every_node_with_a_limit_or_a_leaf_is_one_rule() {
    let once = parse(&[("m.yaml".into(), MESSAGING.into())]).unwrap();
    let again = parse(&[("m.yaml".into(), MESSAGING.into())]).unwrap();
    assert_eq!(once, again);
    let ids: Vec<String> =
        once.domains.values().flat_map(|rules| rules.keys().map(ToString::to_string)).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(
        ids.iter().all(|id| id.starts_with("messaging.") && RuleId::parse(id.clone()).is_ok()),
        "{ids:?}"
    );
    // A long or odd path still makes a valid id, and two paths never share one.
    let odd = Service::parse("d").unwrap();
    let path = |value: &str| {
        vec![PathEntry { key: "k".into(), value: Some(value.into()), share_threshold: false, order: 0 }]
    };
    let long = "x".repeat(300);
    assert!(RuleId::parse(RuleId::for_descriptor(&odd, &path(&long)).to_string()).is_ok());
    assert_ne!(RuleId::for_descriptor(&odd, &path("a b")), RuleId::for_descriptor(&odd, &path("a_b")));
}

#[test]
fn a_files_flags_and_limits_are_kept_as_it_says_them() {
    let read = parse(&[(
        "flags.yaml".into(),
        "
domain: flags
descriptors:
  - key: tenant
    value: '*'
    share_threshold: true
    shadow_mode: true
    detailed_metric: true
    rate_limit:
      name: tenants
      unit: HOUR
      requests_per_unit: 0
  - key: vip
    rate_limit:
      unlimited: true
      replaces:
        - name: tenants
"
        .into(),
    )])
    .unwrap();
    let rules: Vec<&DescriptorRule> =
        read.domains.values().flat_map(|rules| rules.values()).filter_map(RuleSpec::descriptor).collect();
    let tenants = rules.iter().find(|rule| rule.name.as_deref() == Some("tenants")).unwrap();
    assert_eq!(tenants.limit, per(0, Unit::Hour));
    assert!(tenants.shadow_mode && tenants.detailed_metric && tenants.path[0].share_threshold);
    assert_eq!(tenants.source, "flags.yaml");
    let vip = rules.iter().find(|rule| rule.limit == PathLimit::Unlimited).unwrap();
    assert_eq!(vip.replaces, ["tenants"]);
}

/// Each refusal envoyproxy/ratelimit makes, with the file and the descriptor path named.
#[test]
fn a_file_envoyproxy_ratelimit_refuses_is_refused_naming_the_file_and_the_descriptor_path() {
    let cases: &[(&str, &str, &str)] = &[
        ("domain: d\ndescriptors:\n  - key: a\n    rate_limits: {unit: second, requests_per_unit: 1}\n", "d.a", "unknown key 'rate_limits'"),
        ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n", "d.a", "error checking config"),
        ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "d.a", "invalid rate limit unit 'fortnight'"),
        ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: 1}\n", "d.a", "invalid rate limit unit ''"),
        ("domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: a\n    value: b\n", "d.a_b", "duplicate descriptor composite key 'd.a_b'"),
        ("domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - value: b\n", "d.a", "descriptor has empty key"),
        ("descriptors:\n  - key: a\n", "", "config file cannot have empty domain"),
        ("domain: ''\n", "", "config file cannot have empty domain"),
        ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n", "d.a", "should not specify rate limit unit when unlimited"),
        ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}\n", "d.a", "should not have an empty replaces entry"),
        ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: x, unit: second, requests_per_unit: 1, replaces: [{name: x}]}\n", "d.a", "replaces should not contain name of same descriptor"),
        ("domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n", "d.a_b", "share_threshold can only be used with wildcard values"),
        ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n", "d.a", "requests_per_unit"),
        ("domain: d\ndescriptors: [key: a\n", "", "error loading config file"),
    ];
    for (text, path, reason) in cases {
        let refused =
            parse(&[("ok.yaml".into(), MESSAGING.into()), ("bad.yaml".into(), (*text).into())]).unwrap_err();
        assert_eq!(refused.file, "bad.yaml", "{text}");
        assert_eq!(refused.path, *path, "{text}: {refused}");
        assert!(refused.reason.contains(reason), "{text}: {refused}");
    }
    let twice =
        parse(&[("a.yaml".into(), MESSAGING.into()), ("b.yaml".into(), MESSAGING.into())]).unwrap_err();
    assert_eq!(twice.file, "b.yaml");
    assert!(twice.reason.contains("duplicate domain 'messaging'"), "{twice}");
}

#[test]
fn a_directory_is_read_by_name_below_it_skipping_hidden_entries_and_following_links() {
    let root = std::env::temp_dir().join(format!("plexsphere-rules-{}", uuid::Uuid::new_v4()));
    let data = root.join("..2026_12_04");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("messaging.yaml"), MESSAGING).unwrap();
    std::os::unix::fs::symlink(&data, root.join("..data")).unwrap();
    std::os::unix::fs::symlink(root.join("..data/messaging.yaml"), root.join("messaging.yaml")).unwrap();
    std::fs::write(root.join(".hidden.yaml"), "not: yaml: at: all").unwrap();
    let read = read(std::slice::from_ref(&root)).unwrap();
    assert_eq!(read.files, ["messaging.yaml"]);
    assert_eq!(read.domains.len(), 1);
    std::fs::remove_dir_all(&root).unwrap();
}
