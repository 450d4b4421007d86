//! The access context: Domains, Node enrolment and Node credentials.
