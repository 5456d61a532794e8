"""The Kafka protocol: wire codecs, the listener, security, admin forwarding and the
produce/fetch API handlers."""
