//! The operator routes' request bodies and queries: bytes in, validated domain values out, or
//! the 4xx [`ApiError`] to answer. Pure functions of their input, so the fuzz targets
//! (`tests/fuzz`) reach every parser a request goes through without a server or a database.

use axum::extract::Query;
use axum::http::Uri;
use serde::Deserialize;

use super::error::ApiError;

/// Parses a JSON body of type `T`, answering 400 for anything malformed.
fn json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|error| ApiError::bad_request(format!("malformed JSON body: {error}")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateDomain {
    name: String,
    tier: Option<String>,
    issuance_per_second: Option<f64>,
    issuance_burst: Option<f64>,
}

/// What `POST /v1/domains` asks for, validated.
#[derive(Debug)]
pub struct DomainRequest {
    /// The Domain's name.
    pub name: access::DomainName,
    /// Its tier ([`access::Tier::DEFAULT`] unless given).
    pub tier: access::Tier,
    /// Its own issuance budget, a second's worth, which becomes its issuance override rule.
    pub issuance: Option<ratebudget::Limit>,
}

impl CreateDomain {
    fn validate(self) -> Result<DomainRequest, ApiError> {
        let name = access::DomainName::parse(self.name)?;
        let tier = match self.tier {
            Some(text) => access::Tier::parse(&text)?,
            None => access::Tier::DEFAULT,
        };
        let issuance = match (self.issuance_per_second, self.issuance_burst) {
            (None, None) => None,
            // The budget is a rule's, and a rule's table CHECKs the store's own comparisons
            // (an hour to refill at most, arithmetic that stays finite), so one that passes
            // here is stored.
            (Some(per_second), Some(burst)) => {
                Some(ratebudget::Limit::new(per_second, burst).map_err(|invalid| {
                    ApiError::bad_request(format!("invalid issuance_{}: {}", invalid.field, invalid.reason))
                })?)
            }
            _ => {
                return Err(ApiError::bad_request(
                    "issuance_per_second and issuance_burst go together: give both or neither",
                ))
            }
        };
        Ok(DomainRequest { name, tier, issuance })
    }
}

/// The body of `POST /v1/domains`: `{"name", "tier"?, "issuance_per_second"?,
/// "issuance_burst"?}`.
///
/// # Errors
/// A 400 for malformed JSON, an unknown field, an invalid name or tier, or an issuance budget
/// that is half given or that the rate-budget store refuses.
pub fn new_domain(body: &[u8]) -> Result<DomainRequest, ApiError> {
    json::<CreateDomain>(body)?.validate()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnrolNode {
    name: String,
}

/// The body of `POST /v1/domains/{domain_id}/nodes`: `{"name"}`.
///
/// # Errors
/// A 400 for malformed JSON, an unknown field or an invalid name.
pub fn node_name(body: &[u8]) -> Result<access::NodeName, ApiError> {
    Ok(access::NodeName::parse(json::<EnrolNode>(body)?.name)?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PutSecret {
    value: String,
}

/// The body of `PUT /v1/domains/{domain_id}/secrets/{name}`: `{"value"}`.
///
/// # Errors
/// A 400 for malformed JSON, an unknown field or an invalid value.
pub fn secret_value(body: &[u8]) -> Result<secrets::SecretValue, ApiError> {
    Ok(secrets::SecretValue::new(json::<PutSecret>(body)?.value)?)
}

/// The query of `GET /v1/audit`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditQuery {
    /// Entries older than this id only.
    before: Option<i64>,
    /// The most entries returned: 1 to 1000, 100 unless given.
    limit: Option<usize>,
}

/// The query of `GET /v1/audit`: `before=<id>&limit=<n>`, both optional.
///
/// # Errors
/// A 400 for a query that does not decode, an unknown parameter or a limit out of range.
pub fn audit_page(query: Option<&str>) -> Result<audit::Page, ApiError> {
    let uri: Uri = format!("/?{}", query.unwrap_or_default())
        .parse()
        .map_err(|_| ApiError::bad_request("unreadable query"))?;
    let Query(query) = Query::<AuditQuery>::try_from_uri(&uri)
        .map_err(|rejection| ApiError::bad_request(format!("unreadable query: {}", rejection.body_text())))?;
    Ok(audit::Page::new(query.before, query.limit.unwrap_or(100))?)
}
