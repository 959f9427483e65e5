//! meshcat agent library.

pub mod debugwindow;
pub mod logtail;
