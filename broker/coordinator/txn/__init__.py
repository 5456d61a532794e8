"""The transaction coordinator on ``__transaction_state``."""
