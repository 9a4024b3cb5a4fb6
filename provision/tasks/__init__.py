"""One module per command: build the host request, turn the answer into a HostResult."""
