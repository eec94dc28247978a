"""The transaction coordinator (issue #16): transactional ids, their producer ids and epochs, and the state of
each one's transaction, persisted in a journal. See kbroker/transactions/coordinator.py."""
