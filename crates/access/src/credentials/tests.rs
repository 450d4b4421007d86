use super::*;

fn node() -> crate::AuthenticatedNode {
    crate::AuthenticatedNode { node_id: crate::NodeId::random(), domain_id: crate::DomainId::random() }
}

fn listening_cache() -> CredentialCache {
    let cache = CredentialCache::new(10);
    cache.resume();
    cache
}

#[test]
fn a_revocation_during_a_lookup_keeps_the_lookups_answer_out_of_the_cache() {
    let cache = listening_cache();
    let node = node();
    let Err(lookup) = cache.get(&[1; 32]) else { panic!("an empty cache holds nothing") };
    // The store answered before the revocation committed; the announcement arrives first.
    cache.revoke(node.node_id);
    cache.insert(lookup, [1; 32], node);
    assert!(cache.get(&[1; 32]).is_err());
}

#[test]
fn a_revocation_forgets_only_that_nodes_credentials() {
    let cache = listening_cache();
    let (revoked, kept) = (node(), node());
    for (hash, node) in [([1; 32], revoked), ([2; 32], kept)] {
        let Err(lookup) = cache.get(&hash) else { panic!("not cached yet") };
        cache.insert(lookup, hash, node);
    }
    cache.revoke(revoked.node_id);
    assert!(cache.get(&[1; 32]).is_err());
    assert_eq!(cache.get(&[2; 32]).ok(), Some(kept));
}

#[test]
fn while_revocations_cannot_arrive_the_cache_is_bypassed() {
    let cache = CredentialCache::new(10);
    let Err(lookup) = cache.get(&[1; 32]) else { panic!("not cached yet") };
    cache.insert(lookup, [1; 32], node());
    assert!(cache.get(&[1; 32]).is_err(), "a cache never resumed keeps nothing");
    cache.resume();
    let Err(lookup) = cache.get(&[1; 32]) else { panic!("not cached yet") };
    cache.insert(lookup, [1; 32], node());
    assert!(cache.get(&[1; 32]).is_ok());
    cache.suspend();
    assert!(cache.get(&[1; 32]).is_err());
}
