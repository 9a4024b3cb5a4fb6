"""What the user sees: verdicts and HostResult, the report (table, lines, JSON), live progress."""
