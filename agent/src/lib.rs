//! meshcat agent library.
