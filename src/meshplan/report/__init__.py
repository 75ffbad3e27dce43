"""Reports: the only place (with the CLI) that formats numbers for people."""
