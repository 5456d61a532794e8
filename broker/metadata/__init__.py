"""The broker's metadata follower: the loader, the local checkpoint and the client-facing cache."""
