"""The `meshplan` commands, one module each: its flags (``register``) and what it runs (``run``).

``common`` holds what every command shares: the scenario flags and their defaults (the worked example),
how a scenario is built from them, and the progress line. ``meshplan.cli`` builds the parser from these
modules and turns errors into one line and an exit status.
"""
