"""How a server runs on a host: one ServerBackend interface (base.py), three implementations
(detached.py: a watcher in its own session; systemd.py: a persistent unit; container.py: the
runtime), picked once from the record or the request (select.py).  STDLIB ONLY.

The implementations never import one another (an import-linter contract says so): what the
detached and systemd backends share (the watcher, the process tree) is in tree.py; what every
backend shares (the record, process identity, the port lock) in record.py, identity.py, lock.py.
"""
