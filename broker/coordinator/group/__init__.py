"""The classic group coordinator: Kafka's record formats, the pure state machine, the APIs."""
