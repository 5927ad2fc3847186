"""The periodic statistics job: reading the store, computing a tick, electing the leader."""
