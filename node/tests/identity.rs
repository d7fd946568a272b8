//! Persistent identity: the key file is created, reused across restarts, and a corrupt
//! one is refused (and left as it was).

mod common;

use std::time::Duration;

use sigma_node::{IdentityError, Node, NodeConfig, NodeError};

fn config(key: &std::path::Path) -> NodeConfig {
    NodeConfig { key_file: Some(key.to_owned()), ..common::config(5, 3, Duration::from_secs(2)) }
}

#[tokio::test]
async fn key_file_is_created_then_reused() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("state/node-a/key");
    let node = Node::start(config(&key)).await.unwrap();
    let first = node.peer_id();
    assert!(key.exists(), "key file created with its directories");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "key file mode {mode:o}");
    }
    let bytes = std::fs::read(&key).unwrap();
    node.shutdown().await.unwrap();

    let node = Node::start(config(&key)).await.unwrap();
    assert_eq!(node.peer_id(), first, "same identity after a restart");
    assert_eq!(node.handle().status().await.unwrap().peer_id, first);
    node.shutdown().await.unwrap();
    assert_eq!(std::fs::read(&key).unwrap(), bytes, "key file not rewritten");

    // Without a key file every start is a new identity.
    let a = Node::start(common::config(5, 3, Duration::from_secs(2))).await.unwrap();
    let b = Node::start(common::config(5, 3, Duration::from_secs(2))).await.unwrap();
    assert_ne!(a.peer_id(), b.peer_id());
}

#[tokio::test]
async fn corrupt_key_file_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, b"\x08\x01\x12\x05short").unwrap();
    let err = Node::start(config(&key)).await.unwrap_err();
    assert!(matches!(err, NodeError::Identity(IdentityError::Corrupt { .. })), "{err:?}");
    let message = err.to_string();
    assert!(message.contains(&key.display().to_string()) && message.contains("untouched"), "{message}");
    assert_eq!(std::fs::read(&key).unwrap(), b"\x08\x01\x12\x05short", "corrupt file left as it was");
}

#[tokio::test]
async fn bad_listen_and_bootstrap_addresses_are_clear_errors() {
    let no_peer_id = NodeConfig {
        bootstrap: vec!["/ip4/127.0.0.1/tcp/1".parse().unwrap()],
        ..common::config(5, 3, Duration::from_secs(2))
    };
    let err = Node::start(no_peer_id).await.unwrap_err();
    assert!(matches!(err, NodeError::Bootstrap { .. }), "{err:?}");

    // An address of no local interface (TEST-NET-1). Note: a port already used by
    // another node is *not* an error: libp2p-tcp listens with SO_REUSEPORT.
    let foreign = NodeConfig {
        listen: vec!["/ip4/192.0.2.1/tcp/0".parse().unwrap()],
        ..common::config(5, 3, Duration::from_secs(2))
    };
    let err = Node::start(foreign).await.unwrap_err();
    assert!(matches!(err, NodeError::Listen { .. }), "{err:?}");
    assert!(err.to_string().contains("192.0.2.1"), "{err}");

    let unsupported = NodeConfig {
        listen: vec!["/dns4/example.com/tcp/1".parse().unwrap()],
        ..common::config(5, 3, Duration::from_secs(2))
    };
    let err = Node::start(unsupported).await.unwrap_err();
    assert!(matches!(err, NodeError::Listen { .. }), "{err:?}");
}
