"""The command line: click only. Parse, pick hosts, call a task, print the report."""
