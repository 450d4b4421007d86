//! What both transports share at the edge: who is calling (operator and decide tokens, one
//! bearer parser), the failed-authentication throttle per client address, and how much
//! database time a call has.

pub mod database_time;
pub mod throttle;
pub mod tokens;
