//! The values ingest works with: who sends a batch, the batch, and what it costs.

use std::fmt;

use uuid::Uuid;

/// A Domain, as ingest knows it: the tenant whose quota every one of its Nodes spends.
///
/// Ingest declares its own id rather than borrowing the access context's, so the contexts stay
/// independent; the composition root converts between them through the uuid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DomainId(Uuid);

/// A Node, as ingest knows it: the agent that sends batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(Uuid);

/// One accepted batch's id, minted by ingest when it accepts the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchId(Uuid);

macro_rules! uuid_id {
    ($name:ident) => {
        impl $name {
            /// The id's uuid.
            pub fn as_uuid(self) -> Uuid {
                self.0
            }
        }

        impl From<Uuid> for $name {
            fn from(id: Uuid) -> Self {
                $name(id)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

uuid_id!(DomainId);
uuid_id!(NodeId);
uuid_id!(BatchId);

impl BatchId {
    /// A new random (v4) id.
    pub fn random() -> BatchId {
        BatchId(Uuid::new_v4())
    }
}

/// The authenticated Node sending a batch, and the Domain it belongs to.
///
/// Authentication is not ingest's concern: the caller has already established both ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sender {
    /// The Node whose `ingest_node` quota the batch spends.
    pub node: NodeId,
    /// The Domain whose `ingest_domain` quota the batch spends.
    pub domain: DomainId,
}

/// One telemetry batch as received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batch<'a> {
    /// The id the batch is stored under.
    pub id: BatchId,
    /// Who sent it.
    pub sender: Sender,
    /// The body exactly as received; ingest does not interpret it.
    pub payload: &'a [u8],
}

impl Batch<'_> {
    /// What the batch costs against each quota: its wire bytes.
    pub fn byte_cost(&self) -> u64 {
        byte_cost(self.payload)
    }
}

/// What a payload costs against each quota: its length in bytes as received.
///
/// Wire bytes rather than a count of records, because bytes are what a batch costs the
/// deployment to receive and store, however the Node packs it.
pub fn byte_cost(payload: &[u8]) -> u64 {
    // A usize is at most 64 bits on every target Rust supports, so this never truncates.
    payload.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_costs_its_length_in_bytes() {
        assert_eq!(byte_cost(b""), 0);
        assert_eq!(byte_cost(&[0u8; 1500]), 1500);
        // Multi-byte text costs its encoded bytes, not its characters.
        assert_eq!(byte_cost("métrique".as_bytes()), 9);
        let sender = Sender { node: Uuid::new_v4().into(), domain: Uuid::new_v4().into() };
        let batch = Batch { id: BatchId::random(), sender, payload: b"cpu=0.5" };
        assert_eq!(batch.byte_cost(), 7);
    }

    #[test]
    fn ids_round_trip_through_their_uuid_and_display_as_it() {
        let uuid = Uuid::new_v4();
        assert_eq!(NodeId::from(uuid).as_uuid(), uuid);
        assert_eq!(DomainId::from(uuid).to_string(), uuid.to_string());
        assert_ne!(BatchId::random(), BatchId::random());
    }
}
