//! A JSON body's members taken one by one by name, so each bad one is a 400 naming it.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use serde_json::{Map, Value};

use super::error::ApiError;
use super::extract::{read_body, OPERATOR_BODY_LIMIT};

/// A JSON object's members, taken one by one by name, so that a member of the wrong type, a
/// missing one and an unknown one are each a 400 naming it.
pub(super) struct Fields(pub(super) Map<String, Value>);

impl Fields {
    /// The body as a JSON object.
    pub(super) fn parse(body: Result<Bytes, BytesRejection>) -> Result<Fields, ApiError> {
        let body = read_body(body, OPERATOR_BODY_LIMIT)?;
        match serde_json::from_slice(&body) {
            Ok(Value::Object(members)) => Ok(Fields(members)),
            Ok(_) => Err(ApiError::bad_request("the body must be a JSON object")),
            Err(error) => Err(ApiError::bad_request(format!("malformed JSON body: {error}"))),
        }
    }

    fn take<T>(
        &mut self,
        name: &'static str,
        what: &str,
        read: impl FnOnce(&Value) -> Option<T>,
    ) -> Result<Option<T>, ApiError> {
        match self.0.remove(name) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => read(&value)
                .map(Some)
                .ok_or_else(|| ApiError::bad_request(format!("invalid {name}: must be {what}"))),
        }
    }

    pub(super) fn string(&mut self, name: &'static str) -> Result<Option<String>, ApiError> {
        self.take(name, "a string", |value| value.as_str().map(str::to_owned))
    }

    pub(super) fn number(&mut self, name: &'static str) -> Result<Option<f64>, ApiError> {
        self.take(name, "a number", Value::as_f64)
    }

    pub(super) fn integer(&mut self, name: &'static str) -> Result<Option<i64>, ApiError> {
        self.take(name, "a whole number", Value::as_i64)
    }

    /// The selector's members, each a key and a string value.
    pub(super) fn selector_pairs(&mut self, shape: &str) -> Result<Option<Vec<(String, String)>>, ApiError> {
        let Some(members) = self.take("selector", shape, |value| value.as_object().cloned())? else {
            return Ok(None);
        };
        let mut pairs = Vec::with_capacity(members.len());
        for (key, value) in members {
            let Value::String(text) = value else {
                return Err(ApiError::bad_request(format!("invalid selector: must be {shape}")));
            };
            pairs.push((key, text));
        }
        Ok(Some(pairs))
    }

    pub(super) fn selector(&mut self) -> Result<Option<rules::Selector>, ApiError> {
        let shape = "an object such as {}, {\"tier\": \"premium\"} or {\"domain\": \"<uuid>\"}";
        let Some(pairs) = self.selector_pairs(shape)? else { return Ok(None) };
        Ok(Some(rules::Selector::from_pairs(
            pairs.iter().map(|(key, value)| (key.as_str(), value.as_str())),
        )?))
    }

    /// Fails on any member not taken: a misspelt field must not be silently ignored.
    pub(super) fn finish(self) -> Result<(), ApiError> {
        match self.0.keys().next() {
            None => Ok(()),
            Some(unknown) => Err(ApiError::bad_request(format!("unknown field {unknown:?}"))),
        }
    }
}
