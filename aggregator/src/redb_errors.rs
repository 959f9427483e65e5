//! What the aggregator's two redb files (the registrations in `store::persist`, the
//! history in `history::log`) share in their errors: turning each of redb's error
//! types into the `Db(redb::Error)` variant of their own error enum, which
//! [`crate::redb_file`] reads to tell a storage failure from the write's own.

/// `From` each of redb's error types for `$error`, through its `Db(redb::Error)`
/// variant, and [`crate::redb_file::DbError`] for it.
macro_rules! from_redb_errors {
    ($error:ty) => {
        $crate::redb_errors::from_redb_errors!(
            $error: redb::DatabaseError,
            redb::TransactionError,
            redb::TableError,
            redb::StorageError,
            redb::CommitError
        );
        impl $crate::redb_file::DbError for $error {
            fn redb(&self) -> Option<&redb::Error> {
                match self {
                    Self::Db(e) => Some(e),
                    _ => None,
                }
            }
        }
    };
    ($error:ty: $($t:ty),*) => {$(
        impl From<$t> for $error {
            fn from(e: $t) -> Self {
                Self::Db(e.into())
            }
        }
    )*};
}
pub(crate) use from_redb_errors;
