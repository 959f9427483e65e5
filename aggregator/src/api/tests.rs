//! Router tests.
