//! Persistent peer identity: an ed25519 key in a file.
//!
//! The file holds the key in libp2p's protobuf encoding
//! (`Keypair::to_protobuf_encoding`). It is created on first use, with its parent
//! directories, readable by the owner only (mode 0600 on Unix); later runs reuse it, so
//! the peer keeps its `PeerId` (and hence its place in the DHT) across restarts. A file
//! that does not decode is reported and never overwritten.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use libp2p::identity::Keypair;

use crate::error::IdentityError;

/// Loads the key in `path`, or creates a new ed25519 key there if the file does not
/// exist.
pub fn load_or_create(path: &Path) -> Result<Keypair, IdentityError> {
    match fs::read(path) {
        Ok(bytes) => decode(path, &bytes),
        Err(e) if e.kind() == io::ErrorKind::NotFound => match create(path) {
            Ok(keypair) => Ok(keypair),
            // Created by someone else in between: use theirs.
            Err(IdentityError::Create { source, .. }) if source.kind() == io::ErrorKind::AlreadyExists => {
                let bytes = fs::read(path).map_err(|source| IdentityError::Read { path: path.to_owned(), source })?;
                decode(path, &bytes)
            }
            Err(e) => Err(e),
        },
        Err(source) => Err(IdentityError::Read { path: path.to_owned(), source }),
    }
}

fn decode(path: &Path, bytes: &[u8]) -> Result<Keypair, IdentityError> {
    let keypair = Keypair::from_protobuf_encoding(bytes)
        .map_err(|e| IdentityError::Corrupt { path: path.to_owned(), reason: e.to_string() })?;
    warn_if_exposed(path);
    tracing::debug!(path = %path.display(), peer = %keypair.public().to_peer_id(), "loaded the peer identity");
    Ok(keypair)
}

fn create(path: &Path) -> Result<Keypair, IdentityError> {
    let err = |source| IdentityError::Create { path: path.to_owned(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(err)?;
    }
    let keypair = Keypair::generate_ed25519();
    let bytes = keypair.to_protobuf_encoding().map_err(|e| err(io::Error::other(e)))?;
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(err)?;
    let written = file.write_all(&bytes).and_then(|()| file.sync_all());
    if let Err(source) = written {
        // Do not leave a truncated key behind: it would be refused on the next start.
        drop(file);
        let _ = fs::remove_file(path);
        return Err(err(source));
    }
    tracing::info!(path = %path.display(), peer = %keypair.public().to_peer_id(), "created a new peer identity");
    Ok(keypair)
}

#[cfg(unix)]
fn warn_if_exposed(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = fs::metadata(path) {
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(path = %path.display(), mode = format!("{:o}", mode & 0o777), "key file is readable by others");
        }
    }
}

#[cfg(not(unix))]
fn warn_if_exposed(_path: &Path) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_then_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/key");
        let first = load_or_create(&path).unwrap();
        assert!(path.exists());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let second = load_or_create(&path).unwrap();
        assert_eq!(first.public().to_peer_id(), second.public().to_peer_id());
    }

    #[test]
    fn corrupt_file_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        fs::write(&path, b"not a key").unwrap();
        let err = load_or_create(&path).unwrap_err();
        assert!(matches!(err, IdentityError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("left untouched"), "{err}");
        assert_eq!(fs::read(&path).unwrap(), b"not a key");
    }

    #[test]
    fn empty_file_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        fs::write(&path, b"").unwrap();
        assert!(matches!(load_or_create(&path), Err(IdentityError::Corrupt { .. })));
    }

    #[test]
    fn unreadable_path_is_a_read_error() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be.
        let err = load_or_create(dir.path()).unwrap_err();
        assert!(matches!(err, IdentityError::Read { .. }), "{err}");
    }
}
