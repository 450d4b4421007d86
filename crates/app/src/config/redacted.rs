//! Values whose `Debug` never shows a secret, so that `Config`'s derived `Debug` can be logged
//! whole: [`Redacted`] for tokens and keys, [`Database`] for connection options, which hold the
//! database's password.

use std::fmt;
use std::ops::{Deref, DerefMut};

use sqlx::postgres::PgConnectOptions;

/// `T`, shown by `Debug` as `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Redacted<T>(T);

impl<T> Redacted<T> {
    /// Wraps `value`.
    pub fn new(value: T) -> Redacted<T> {
        Redacted(value)
    }
}

impl<T> Deref for Redacted<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> DerefMut for Redacted<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

impl<T> fmt::Debug for Redacted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A database's connection options, shown by `Debug` as where they lead (user, host, port,
/// database), never with the password.
#[derive(Clone)]
pub struct Database(PgConnectOptions);

impl Database {
    /// Wraps `options`.
    pub fn new(options: PgConnectOptions) -> Database {
        Database(options)
    }
}

impl Deref for Database {
    type Target = PgConnectOptions;

    fn deref(&self) -> &PgConnectOptions {
        &self.0
    }
}

impl DerefMut for Database {
    fn deref_mut(&mut self) -> &mut PgConnectOptions {
        &mut self.0
    }
}

impl fmt::Debug for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let options = &self.0;
        write!(
            f,
            "postgres://{}@{}:{}/{}",
            options.get_username(),
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or_default()
        )
    }
}

#[cfg(test)]
mod tests;
