//! The lab's errors.

/// Lab errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command { cmd: String, status: String, stderr: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Other(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// A message made where the lab found something wrong (the bench's and
/// the load generator's checks), so that `?` carries it as an [`Error`].
impl From<String> for Error {
    fn from(s: String) -> Error {
        Error::Other(s)
    }
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}
