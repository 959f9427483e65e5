//! meshcat agent library.

pub mod report;
